"""Weaviate: weaviate-server (built with `make weaviate`) locally, gossip/raft clusters on HPC.

Everything about this database lives in this folder: ``settings`` (its config model and client packages,
pydantic only), ``env`` (its server environment, shared by local and HPC), ``deploy`` (local deployment),
``client`` (weaviate-client), ``adapter`` (assembles ``ADAPTER``), ``ranks`` (its ranks on an HPC pilot job)
and ``checks`` (its own config checks on HPC).
"""
