"""Qdrant's quantisation and on-disk storage, built the same way for the embedded engine and for servers.

``qdrant_edge`` and ``qdrant_client.models`` name the same configuration classes differently; :func:`plan`
turns the database-neutral spec into one :class:`StoragePlan` and each client renders it with its library.

* ``quantization``: scalar = int8 (quantile 0.99), pq = product quantisation, bq = binary (1 bit per
  dimension). Searches rescore the quantised candidates with the original vectors (``rescore``), after
  oversampling them by ``spec.options['oversampling']`` (default 1: no oversampling).
* Qdrant's product quantiser is set by a compression ratio, with 8-bit codes: ``pq_m`` sub-vectors of
  ``dim / pq_m`` dimensions give ``4 * dim / pq_m`` (float32 bytes per code byte), rounded to the nearest
  ratio Qdrant offers (x4, x8, x16, x32, x64); ``describe`` reports the ratio used.
* ``on_disk``: the original vectors and the HNSW graph are memory-mapped files instead of RAM; quantised
  vectors then stay in RAM (``always_ram``), Qdrant's own advice for a disk-backed collection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apps.vdb.base import CollectionSpec, DatabaseError

RATIOS = (4, 8, 16, 32, 64)


@dataclass(frozen=True)
class StoragePlan:
    """What a collection's vectors look like in Qdrant (one plan for edge and for qdrant-client)."""

    quantization: str  # none, scalar, pq, bq
    pq_ratio: int | None  # compression ratio of the product quantiser
    on_disk: bool  # original vectors and HNSW graph memory-mapped from disk
    always_ram: bool | None  # quantised vectors pinned in RAM (set with on_disk)
    oversampling: float | None  # candidates fetched per result before rescoring (None: Qdrant's 1.0)

    def details(self) -> dict[str, str | int | bool | None]:
        """The plan as describe() reports it next to what the engine says."""
        return {"quantization": self.quantization, "pq_ratio": self.pq_ratio, "on_disk": self.on_disk}


def pq_ratio(dim: int, pq_m: int) -> int:
    """Qdrant's compression ratio nearest to ``pq_m`` 8-bit codes of a ``dim``-dimensional vector."""
    wanted = 4 * dim / pq_m
    return min(RATIOS, key=lambda r: abs(math.log2(r) - math.log2(wanted)))


def plan(spec: CollectionSpec) -> StoragePlan:
    """The storage plan of ``spec`` (DatabaseError for what Qdrant cannot build)."""
    if spec.quantization != "none" and spec.index_type != "hnsw":
        raise DatabaseError(f"qdrant: quantization {spec.quantization!r} needs index_type hnsw")
    if spec.quantization == "pq" and spec.pq_bits != 8:
        raise DatabaseError(f"qdrant: product quantisation uses 8-bit codes, not pq_bits {spec.pq_bits}")
    oversampling = spec.options.get("oversampling")
    return StoragePlan(
        quantization=spec.quantization,
        pq_ratio=pq_ratio(spec.dim, spec.pq_m) if spec.quantization == "pq" else None,
        on_disk=spec.on_disk,
        always_ram=True if spec.on_disk and spec.quantization != "none" else None,
        oversampling=float(oversampling) if oversampling is not None else None,
    )


def edge_quantization(p: StoragePlan) -> object | None:
    """The ``qdrant_edge`` quantisation config of plan ``p`` (None: no quantisation)."""
    import qdrant_edge as qe

    if p.quantization == "scalar":
        return qe.ScalarQuantizationConfig(qe.ScalarType.Int8, quantile=0.99, always_ram=p.always_ram)
    if p.quantization == "pq":
        ratio = getattr(qe.CompressionRatio, f"X{p.pq_ratio}")
        return qe.ProductQuantizationConfig(ratio, always_ram=p.always_ram)
    if p.quantization == "bq":
        return qe.BinaryQuantizationConfig(always_ram=p.always_ram)
    return None


def edge_search_params(p: StoragePlan, ef: int | None) -> object | None:
    """``qdrant_edge.SearchParams`` for one search (None: the engine's defaults)."""
    import qdrant_edge as qe

    quant = None
    if p.quantization != "none":
        quant = qe.QuantizationSearchParams(rescore=True, oversampling=p.oversampling)
    return qe.SearchParams(hnsw_ef=ef, quantization=quant) if ef or quant else None


def client_quantization(p: StoragePlan) -> object | None:
    """The ``qdrant_client.models`` quantisation config of plan ``p`` (None: no quantisation)."""
    from qdrant_client import models as m

    if p.quantization == "scalar":
        scalar = m.ScalarQuantizationConfig(type=m.ScalarType.INT8, quantile=0.99, always_ram=p.always_ram)
        return m.ScalarQuantization(scalar=scalar)
    if p.quantization == "pq":
        ratio = m.CompressionRatio(f"x{p.pq_ratio}")
        return m.ProductQuantization(
            product=m.ProductQuantizationConfig(compression=ratio, always_ram=p.always_ram)
        )
    if p.quantization == "bq":
        return m.BinaryQuantization(binary=m.BinaryQuantizationConfig(always_ram=p.always_ram))
    return None


def client_search_params(p: StoragePlan, ef: int | None) -> object | None:
    """``qdrant_client.models.SearchParams`` for one search (None: the server's defaults)."""
    from qdrant_client import models as m

    quant = None
    if p.quantization != "none":
        quant = m.QuantizationSearchParams(rescore=True, oversampling=p.oversampling)
    return m.SearchParams(hnsw_ef=ef, quantization=quant) if ef or quant else None
