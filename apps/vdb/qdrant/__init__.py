"""Qdrant: the embedded engine (qdrant-edge-py) locally, qdrant-client against servers, p2p peers on HPC.

Everything about this database lives in this folder: ``settings`` (its config model, pydantic only),
``env`` (its server environment, shared by local and HPC), ``deploy`` (local deployment), ``client`` /
``edge`` / ``server`` (the clients; ``connect`` picks one; ``handles``: shared open shards), ``storage``
(quantisation and on-disk plans), ``ranks`` (its ranks on an HPC pilot job) and ``checks`` (its own config
checks on HPC).
"""

from __future__ import annotations

from apps.vdb.declaration import Database, Lazy
from apps.vdb.qdrant.settings import QdrantSettings, index_problems, with_threads


def _in_process(settings: QdrantSettings) -> bool:
    """Edge, and qdrant-client's local mode (``url: ':memory:'`` or ``local_path``), run the engine inside
    the client process: there is no server to deploy, and one client."""
    return settings.mode == "edge" or settings.url == ":memory:" or settings.local_path is not None


DATABASE = Database(
    name="qdrant",
    settings=QdrantSettings,
    packages=("qdrant-client", "qdrant-edge-py"),
    index_types=("hnsw", "flat"),
    deployment=Lazy("apps.vdb.qdrant.deploy:QdrantDeployment"),
    client=Lazy("apps.vdb.qdrant.connect:connect"),
    in_process=_in_process,
    # Quantisation and on-disk vectors: apps/vdb/qdrant/storage.py.
    quantizations={"hnsw": ("none", "scalar", "pq", "bq")},
    on_disk=("hnsw", "flat"),
    limits={
        "quantization": "Qdrant searches quantised vectors through its HNSW index; a flat collection scans "
        "the original vectors"
    },
    index_problems=index_problems,
    with_threads=with_threads,
    images={
        "qdrant": "qdrant/qdrant:v1.16.x image",
        "qdrant_gpu": "qdrant/qdrant:v1.16.x-gpu-nvidia image, used when gpu_indexing is on",
    },
    ranks=Lazy("apps.vdb.qdrant.ranks:plan_ranks"),
    image_field=Lazy("apps.vdb.qdrant.ranks:image_field"),
    settings_checks=Lazy("apps.vdb.qdrant.checks:settings_problems"),
    cluster_checks=Lazy("apps.vdb.qdrant.checks:cluster_problems"),
)
