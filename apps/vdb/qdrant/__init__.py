"""Qdrant: the embedded engine (qdrant-edge-py) locally, qdrant-client against servers, p2p peers on HPC.

Everything about this database lives in this folder: ``settings`` (its config model, pydantic only),
``adapter`` (local deployment and client), ``ranks`` (its ranks on an HPC pilot job).
"""
