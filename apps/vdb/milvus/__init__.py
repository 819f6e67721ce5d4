"""Milvus: the packaged standalone server locally, standalone or distributed roles on HPC.

Everything about this database lives in this folder: ``settings`` (its config model, pydantic only),
``env`` (its server environment, shared by local and HPC), ``deploy`` (local deployment), ``client``
(pymilvus), ``ranks`` (its ranks on an HPC pilot job) and ``checks`` (its own config checks on HPC).
"""

from __future__ import annotations

from apps.vdb.declaration import Database, Lazy
from apps.vdb.milvus.settings import MilvusSettings, index_problems, with_threads

DATABASE = Database(
    name="milvus",
    settings=MilvusSettings,
    packages=("pymilvus", "milvus"),
    index_types=("hnsw", "ivf_flat", "ivf_pq", "diskann", "flat"),
    deployment=Lazy("apps.vdb.milvus.deploy:MilvusDeployment"),
    client=Lazy("apps.vdb.milvus.client:MilvusVectorClient"),
    # The quantisation each takes (scalar: IVF_SQ8, pq: IVF_PQ; apps/vdb/milvus/indexes.py).
    quantizations={"ivf_flat": ("none", "scalar"), "ivf_pq": ("none", "pq")},
    on_disk=("diskann",),
    always_on_disk=("diskann",),  # DISKANN is on disk whatever on_disk says
    limits={
        "quantization": "Milvus 2.3 quantises only inside IVF indexes (IVF_SQ8 = ivf_flat + scalar, IVF_PQ "
        "= ivf_pq); HNSW_SQ/HNSW_PQ and binary vectors need Milvus 2.5+",
        "on_disk": "Milvus 2.3 keeps indexes in memory but DISKANN (collection mmap came in 2.4)",
    },
    index_problems=index_problems,
    with_threads=with_threads,
    images={
        "milvus": "milvusdb/milvus:v2.6.x image",
        "etcd": "quay.io/coreos/etcd:v3.5.x image (Milvus distributed)",
    },
    ranks=Lazy("apps.vdb.milvus.ranks:plan_ranks"),
    image_field=Lazy("apps.vdb.milvus.ranks:image_field"),
    settings_checks=Lazy("apps.vdb.milvus.checks:settings_problems"),
    cluster_checks=Lazy("apps.vdb.milvus.checks:cluster_problems"),
)
