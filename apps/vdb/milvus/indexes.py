"""Milvus index types: the database-neutral collection spec mapped to Milvus's build and search parameters.

============  ============  =====================================  =============================
index_type    quantization  Milvus index (build params)            search knob (``ef`` means)
============  ============  =====================================  =============================
hnsw          none          HNSW (M, efConstruction)               ef (raised to k)
ivf_flat      none          IVF_FLAT (nlist)                       nprobe (capped at nlist)
ivf_flat      scalar        IVF_SQ8 (nlist): int8 codes            nprobe (capped at nlist)
ivf_pq        pq / none     IVF_PQ (nlist, m = pq_m, nbits)        nprobe (capped at nlist)
diskann       none          DISKANN (Vamana graph + PQ on disk)    search_list (raised to k)
flat          none          FLAT                                   none (exact)
============  ============  =====================================  =============================

DISKANN needs ``queryNode.enableDisk: true`` (the 2.3 default is false: the query node refuses to load a
disk index); the local deployment sets it (:func:`apps.vdb.milvus.deploy.server_overrides`). Its graph
degree and build list come from ``common.DiskIndex`` of milvus.yaml (MaxDegree 56, SearchListSize 100).
"""

from __future__ import annotations

from apps.vdb.base import CollectionSpec, DatabaseError


def milvus_index_type(spec: CollectionSpec) -> str:
    """The Milvus index type that builds ``spec`` (DatabaseError for a combination Milvus lacks)."""
    key = (spec.index_type, spec.quantization)
    table = {
        ("hnsw", "none"): "HNSW",
        ("ivf_flat", "none"): "IVF_FLAT",
        ("ivf_flat", "scalar"): "IVF_SQ8",
        ("ivf_pq", "none"): "IVF_PQ",
        ("ivf_pq", "pq"): "IVF_PQ",
        ("diskann", "none"): "DISKANN",
        ("flat", "none"): "FLAT",
    }
    if key not in table:
        raise DatabaseError(
            f"milvus: no index for index_type {spec.index_type!r} with quantization {spec.quantization!r}"
        )
    if spec.index_type == "ivf_pq" and spec.dim % spec.pq_m:
        raise DatabaseError(
            f"milvus: IVF_PQ needs pq_m ({spec.pq_m}) to divide the dimension ({spec.dim}); "
            "set vdb.collection.pq_m to a divisor"
        )
    return table[key]


def build_params(spec: CollectionSpec, index_type: str) -> dict[str, int]:
    """The build parameters of Milvus index ``index_type`` for ``spec`` (as describe_index reports them)."""
    if index_type == "HNSW":
        return {"M": spec.hnsw_m, "efConstruction": spec.ef_construction}
    if index_type in ("IVF_FLAT", "IVF_SQ8"):
        return {"nlist": spec.ivf_nlist}
    if index_type == "IVF_PQ":
        return {"nlist": spec.ivf_nlist, "m": spec.pq_m, "nbits": spec.pq_bits}
    return {}  # FLAT; DISKANN takes its build parameters from milvus.yaml (common.DiskIndex)


def index_search_params(
    spec: CollectionSpec, ef: int | None, k: int, default_ef: int, default_nprobe: int
) -> dict:
    """The search ``params`` for ``spec``: ``ef`` is ef (HNSW), nprobe (IVF) or search_list (DISKANN)."""
    if spec.index_type == "hnsw":
        return {"ef": max(ef or default_ef, k)}  # Milvus rejects ef < k
    if spec.index_type in ("ivf_flat", "ivf_pq"):
        return {"nprobe": min(ef or default_nprobe, spec.ivf_nlist)}
    if spec.index_type == "diskann":
        return {"search_list": max(ef or default_ef, k)}  # Milvus rejects search_list < k
    return {}
