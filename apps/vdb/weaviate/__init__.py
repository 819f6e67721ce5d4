"""Weaviate: weaviate-server (built with `make weaviate`) locally, gossip/raft clusters on HPC.

Everything about this database lives in this folder: ``settings`` (its config model, pydantic only),
``env`` (its server environment, shared by local and HPC), ``deploy`` (local deployment), ``client``
(weaviate-client; ``indexes``: its index configs), ``ranks`` (its ranks on an HPC pilot job) and ``checks``
(its own config checks on HPC).
"""

from __future__ import annotations

from apps.vdb.declaration import Database, Lazy
from apps.vdb.weaviate.settings import WeaviateSettings, index_problems, local_ranks, with_threads

DATABASE = Database(
    name="weaviate",
    settings=WeaviateSettings,
    packages=("weaviate-client",),
    index_types=("hnsw", "flat", "dynamic"),
    deployment=Lazy("apps.vdb.weaviate.deploy:WeaviateDeployment"),
    client=Lazy("apps.vdb.weaviate.client:WeaviateClient"),
    # The compression each index type takes and the one on disk (apps/vdb/weaviate/indexes.py).
    quantizations={"hnsw": ("none", "scalar", "pq", "bq"), "flat": ("none", "bq"), "dynamic": ("none", "bq")},
    on_disk=("flat",),
    limits={
        "quantization": "Weaviate's flat index (and so the flat stage of dynamic) compresses with BQ only",
        "on_disk": "Weaviate keeps an HNSW graph in memory; its flat index searches the vectors on disk",
    },
    indexes_on_upload=True,  # its async indexing queue; the index stage waits for it to drain
    local_ranks=local_ranks,  # `nodes: N`: a cluster of N processes on this machine
    index_problems=index_problems,
    with_threads=with_threads,
    images={"weaviate": "semitechnologies/weaviate:1.36.0 image"},
    ranks=Lazy("apps.vdb.weaviate.ranks:plan_ranks"),
    image_field=Lazy("apps.vdb.weaviate.ranks:image_field"),
    settings_checks=Lazy("apps.vdb.weaviate.checks:settings_problems"),
    cluster_checks=Lazy("apps.vdb.weaviate.checks:cluster_problems"),
)
