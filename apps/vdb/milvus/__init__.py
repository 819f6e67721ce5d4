"""Milvus: the packaged standalone server locally, standalone or distributed roles on HPC.

Everything about this database lives in this folder: ``settings`` (its config model and client packages,
pydantic only), ``env`` (its server environment, shared by local and HPC), ``deploy`` (local deployment),
``client`` (pymilvus), ``adapter`` (assembles ``ADAPTER``), ``ranks`` (its ranks on an HPC pilot job) and
``checks`` (its own config checks on HPC).
"""
