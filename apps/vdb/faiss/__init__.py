"""FAISS: the library baseline a user would pick instead of a database, run inside the clients.

Everything about it lives in this folder: ``settings`` (its config model, pydantic only), ``rows`` (the
durable row store the insert stage writes), ``build`` (index construction, atomic index files, loading),
``client`` (the Client: insert, build_index, search, ...) and ``deploy`` (a deployment that only owns the
data dir). There is no server and no pilot job: like Qdrant edge it runs in the client block's processes,
so it has no ranks, images or HPC checks (with ``vdb.cluster`` it is one index on the client block: the
vdb stages give an in-process engine ``shards: 1`` there).
"""

from __future__ import annotations

from apps.vdb.declaration import Database, Lazy
from apps.vdb.faiss.settings import FaissSettings

_INDEX_TYPES = ("hnsw", "ivf_flat", "ivf_pq", "flat")

DATABASE = Database(
    name="faiss",
    settings=FaissSettings,
    packages=("faiss-cpu",),
    index_types=_INDEX_TYPES,
    deployment=Lazy("apps.vdb.faiss.deploy:FaissDeployment"),
    client=Lazy("apps.vdb.faiss.client:connect"),
    in_process=True,
    # on_disk memory-maps the index file (IVF lists; HNSW and flat vectors): every type honours it.
    on_disk=_INDEX_TYPES,
)
