"""LanceDB: the embedded engine (PyPI ``lancedb``), run inside the client process on the chosen medium.

Everything about this database lives in this folder: ``settings`` (its config model, pydantic only),
``deploy`` (picks the data directory; nothing to start), ``client`` (tables, upserts, IVF index builds and
searches) and ``checks`` (its config checks on HPC). It has no server, hence no ``env`` or ``ranks``: on
HPC it runs on the client block, never as a pilot job, so it has no layout to check.
"""

from __future__ import annotations

from apps.vdb.declaration import Database, Lazy
from apps.vdb.lancedb.settings import LanceDBSettings

# Not built: hnsw (LanceDB's HNSW always sits inside IVF lists), diskann, dynamic.
_INDEX_TYPES = ("ivf_pq", "ivf_hnsw_sq", "ivf_flat", "flat")

DATABASE = Database(
    name="lancedb",
    settings=LanceDBSettings,
    packages=("lancedb",),
    index_types=_INDEX_TYPES,
    deployment=Lazy("apps.vdb.lancedb.deploy:LanceDBDeployment"),
    client=Lazy("apps.vdb.lancedb.client:connect"),
    in_process=True,
    # The quantisation each index is built with (its PQ codes, its int8 lists), as the client accepts it.
    quantizations={"ivf_pq": ("none", "pq"), "ivf_hnsw_sq": ("none", "scalar")},
    # LanceDB keeps data and indexes in files on the chosen medium whatever on_disk says.
    on_disk=_INDEX_TYPES,
    always_on_disk=_INDEX_TYPES,
    settings_checks=Lazy("apps.vdb.lancedb.checks:settings_problems"),
)
