"""Weaviate's vector index configuration from the database-neutral spec: index type and compression.

==========  =============================  ==========================================================
index_type  quantization                   Weaviate vector index
==========  =============================  ==========================================================
hnsw        none, scalar, pq, bq           HNSW with no quantizer, SQ (int8), PQ (segments = pq_m,
                                           centroids = 2**pq_bits) or BQ (1 bit per dimension)
flat        none, bq                       flat (brute force over the LSM store on disk), BQ codes
dynamic     none, bq                       flat, then HNSW past ``options.dynamic_threshold`` objects;
                                           BQ in both (Weaviate's flat index compresses with BQ only)
==========  =============================  ==========================================================

SQ and PQ train on the first ``options.training_limit`` objects (Weaviate's default: 100000): until a
shard holds that many, its vectors stay uncompressed, and ``describe`` says so per shard (``compressed``).
Compressed HNSW searches rescore candidates with the original vectors (``options.rescore_limit``, BQ/SQ).
``on_disk`` applies to flat: its BQ codes are not cached in memory, so every search reads them from disk
(the flat index always keeps its original vectors on disk); Weaviate keeps an HNSW graph in memory.
"""

from __future__ import annotations

from typing import Any

from apps.vdb.base import CollectionSpec, DatabaseError
from apps.vdb.weaviate import DATABASE

METRICS = {"cosine": "COSINE", "ip": "DOT", "l2": "L2_SQUARED"}
DEFAULT_TRAINING_LIMIT = 100_000  # Weaviate's own, for SQ and PQ


def _option(spec: CollectionSpec, name: str) -> int | None:
    value = spec.options.get(name)
    return int(value) if value is not None else None


def compression_training_limit(spec: CollectionSpec) -> int | None:
    """Objects a shard holds before its vectors are compressed (None: uncompressed; 0: from the start)."""
    if spec.quantization in ("scalar", "pq"):
        return _option(spec, "training_limit") or DEFAULT_TRAINING_LIMIT
    return 0 if spec.quantization == "bq" else None


def quantizer(spec: CollectionSpec) -> Any:
    """The weaviate-client quantizer for ``spec`` (None: uncompressed)."""
    from weaviate.classes.config import Configure

    q = Configure.VectorIndex.Quantizer
    training, rescore = _option(spec, "training_limit"), _option(spec, "rescore_limit")
    if spec.quantization == "scalar":
        return q.sq(training_limit=training, rescore_limit=rescore)
    if spec.quantization == "pq":
        if spec.dim % spec.pq_m or spec.pq_bits > 8:
            raise DatabaseError(
                f"weaviate: PQ needs pq_m ({spec.pq_m}) to divide the dimension ({spec.dim}) and pq_bits "
                f"<= 8 (at most 256 centroids), got pq_bits {spec.pq_bits}"
            )
        return q.pq(segments=spec.pq_m, centroids=2**spec.pq_bits, training_limit=training)
    if spec.quantization == "bq":
        cache = None if spec.index_type == "hnsw" else not spec.on_disk
        return q.bq(cache=cache, rescore_limit=rescore)
    return None


def vector_index(spec: CollectionSpec, async_indexing: bool) -> Any:
    """The weaviate-client vector index config of ``spec`` (DatabaseError for what Weaviate lacks)."""
    from weaviate.classes.config import Configure, VectorDistances

    allowed = DATABASE.quantizations.get(spec.index_type)
    if allowed is None:
        raise DatabaseError(f"Weaviate has no {spec.index_type!r} index (use hnsw, flat or dynamic)")
    if spec.quantization not in allowed:
        raise DatabaseError(
            f"Weaviate's {spec.index_type} index compresses with {', '.join(allowed)}, "
            f"not {spec.quantization!r}"
        )
    if spec.on_disk and spec.index_type != "flat":
        raise DatabaseError("Weaviate keeps an HNSW graph in memory: on_disk needs index_type flat")
    distance = VectorDistances[METRICS[spec.metric]]
    compress = quantizer(spec)
    hnsw = Configure.VectorIndex.hnsw(
        distance_metric=distance,
        max_connections=spec.hnsw_m,
        ef_construction=spec.ef_construction,
        quantizer=compress,
    )
    if spec.index_type == "hnsw":
        return hnsw
    flat = Configure.VectorIndex.flat(distance_metric=distance, quantizer=compress)
    if spec.index_type == "flat":
        return flat
    if not async_indexing:
        raise DatabaseError("Weaviate's dynamic index needs async indexing: set async_indexing: true")
    threshold = _option(spec, "dynamic_threshold")
    return Configure.VectorIndex.dynamic(distance_metric=distance, hnsw=hnsw, flat=flat, threshold=threshold)


def server_index(config: dict) -> dict[str, str | bool | None]:
    """What the server's schema says of a vector index (``vectorConfig.default`` of ``/v1/schema/<class>``):
    its type, the compression enabled in it (per part for dynamic), and flat's BQ cache."""
    kind = config.get("vectorIndexType")
    index = config.get("vectorIndexConfig", {})
    parts = (
        {"hnsw": index.get("hnsw", {}), "flat": index.get("flat", {})} if kind == "dynamic" else {"": index}
    )
    details: dict[str, str | bool | None] = {"server_index_type": kind}
    for part, cfg in parts.items():
        enabled = [q for q in ("pq", "bq", "sq", "rq") if (cfg.get(q) or {}).get("enabled")]
        details[f"server_{part + '_' if part else ''}compression"] = ",".join(enabled) or "none"
    if kind == "flat":
        details["server_bq_cache"] = bool((index.get("bq") or {}).get("cache"))
    return details
