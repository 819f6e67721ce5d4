"""LanceDB: the embedded engine (PyPI ``lancedb``), run inside the client process on the chosen medium.

Everything about this database lives in this folder: ``settings`` (its config model and client packages,
pydantic only), ``deploy`` (picks the data directory; nothing to start), ``client`` (tables, upserts, IVF
index builds and searches), ``adapter`` (assembles ``ADAPTER``) and ``checks`` (its config checks on HPC).
It has no server, hence no ``env`` or ``ranks``: on HPC it runs on the client block (``IN_PROCESS_ONLY``).
"""
