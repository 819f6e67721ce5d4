"""Milvus: the packaged standalone server locally, standalone or distributed roles on HPC.

Everything about this database lives in this folder: ``settings`` (its config model, pydantic only),
``adapter`` (local deployment and client), ``ranks`` (its ranks on an HPC pilot job).
"""
