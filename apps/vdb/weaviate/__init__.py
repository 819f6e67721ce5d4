"""Weaviate: weaviate-server (built with `make weaviate`) locally, gossip/raft clusters on HPC.

Everything about this database lives in this folder: ``settings`` (its config model, pydantic only),
``adapter`` (local deployment and client), ``ranks`` (its ranks on an HPC pilot job).
"""
