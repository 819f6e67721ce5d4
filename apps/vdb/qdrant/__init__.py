"""Qdrant: the embedded engine (qdrant-edge-py) locally, qdrant-client against servers, p2p peers on HPC.

Everything about this database lives in this folder: ``settings`` (its config model and client packages,
pydantic only), ``env`` (its server environment, shared by local and HPC), ``deploy`` (local deployment),
``client`` / ``edge`` / ``server`` (the clients; ``handles``: shared open shards), ``adapter`` (assembles
``ADAPTER``), ``ranks`` (its ranks on an HPC pilot job) and ``checks`` (its own config checks on HPC).
"""
