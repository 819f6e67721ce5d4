"""Configuration of the vector-database stages: the databases, the collection, insert and the query sweep."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field, model_validator

from apps.vdb import settings_models, supported_index_types
from apps.vdb.base import IndexType, Quantization
from apps.vdb.capabilities import collection_problems
from apps.vdb.cluster.config import DatabaseClusterConfig
from core.config import Strict

# Every registered database's settings model, discriminated by ``name`` (pydantic only: no client library).
DatabaseSettings = Annotated[Union[tuple(settings_models())], Field(discriminator="name")]  # noqa: UP007
# One item of a sweep list (k, ef, batch sizes, clients): 0 or a negative would fail mid-run.
Positive = Annotated[int, Field(ge=1)]


class CollectionConfig(Strict):
    """The collection every database builds (database-neutral; adapters map it)."""

    name: str = Field("pes2o_ve", pattern=r"^[A-Za-z][A-Za-z0-9_]*$", description="Collection name.")
    index_type: IndexType = Field(
        "hnsw",
        description="Vector index: hnsw, ivf_flat, ivf_pq, ivf_hnsw_sq, diskann, flat or dynamic "
        "(each database builds the ones docs/engines.md lists).",
    )
    hnsw_m: int = Field(16, ge=2, description="HNSW graph degree M.")
    ef_construction: int = Field(128, ge=8, description="HNSW ef_construction.")
    ivf_nlist: int = Field(128, ge=1, description="IVF lists (ivf_flat, ivf_pq, ivf_hnsw_sq).")
    pq_m: int = Field(16, ge=1, description="Product quantiser sub-vectors (ivf_pq, quantization: pq).")
    pq_bits: int = Field(8, ge=1, le=16, description="Bits per product-quantiser code.")
    quantization: Quantization = Field(
        "none", description="Vector compression beside the index: none, scalar (int8), pq or bq (binary)."
    )
    on_disk: bool = Field(
        False, description="Keep vectors (and the graph where possible) on disk, not in memory."
    )
    shards: int = Field(1, ge=1, description="Shards of the collection (spread over the cluster's nodes).")
    deferred_indexing: bool = Field(
        True, description="Upload first, build the index afterwards (the vendors' bulk-upload advice)."
    )
    options: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="Database-specific knobs passed to the adapters (e.g. segment sizes).",
    )


class InsertConfig(Strict):
    """How vectors are loaded."""

    batch_sizes: list[Positive] = Field(
        [1000],
        min_length=1,
        description="Vectors per insert request; each size is a full upload into a fresh collection (the "
        "throughput-versus-batch-size curve); the last one is kept for indexing and queries.",
    )
    workers: int = Field(1, ge=1, description="Parsl tasks the rows are partitioned across.")
    clients_per_worker: int = Field(
        2, ge=1, description="Client processes per task (processes, not asyncio: conversion is CPU-bound)."
    )
    retries: int = Field(
        5, ge=0, description="Retries of a failed batch (idempotent: ids are deterministic)."
    )
    timeout_s: float = Field(900, gt=0, description="Upper bound on upload and on time to searchability.")


class QuerySweepConfig(Strict):
    """The query sweep: every combination is run over the query set."""

    ef: list[Positive] = Field([16, 32, 64, 128], min_length=1, description="Search-time ef (HNSW) values.")
    batch_size: list[Positive] = Field([1, 32], min_length=1, description="Queries per request.")
    clients: list[Positive] = Field([1], min_length=1, description="Concurrent client processes.")
    k: list[Positive] = Field([10], min_length=1, description="Neighbours per query (<= groundtruth.k).")
    max_queries: int | None = Field(None, ge=1, description="Use at most this many queries per setting.")
    warmup_queries: int = Field(16, ge=0, description="Queries sent (and discarded) before each setting.")


class VdbConfig(Strict):
    """Vector-database stages: deploy, insert, index, query sweep, teardown, report."""

    databases: list[DatabaseSettings] = Field(min_length=1, description="Databases to benchmark, in order.")
    optional: list[str] = Field(
        default_factory=list,
        description="Databases skipped with a note (instead of failing the run) when they cannot start.",
    )
    collection: CollectionConfig = Field(default_factory=CollectionConfig)
    insert: InsertConfig = Field(default_factory=InsertConfig)
    query: QuerySweepConfig = Field(default_factory=QuerySweepConfig)
    startup_timeout_s: float = Field(180, gt=0, description="Time a deployment has to become healthy.")
    index_timeout_s: float = Field(1800, gt=0, description="Time the index build has to reach steady state.")
    cluster: DatabaseClusterConfig | None = Field(
        None,
        description="HPC: run each database as a pilot job of Apptainer servers on its own nodes; "
        "None: start it locally (or attach to the url in its settings).",
    )

    @model_validator(mode="after")
    def _index_types_supported(self) -> VdbConfig:
        for position, db in enumerate(self.databases):
            supported = supported_index_types(db.name)
            if self.collection.index_type not in supported:
                raise ValueError(
                    f"vdb.collection.index_type {self.collection.index_type!r} is not built by "
                    f"vdb.databases[{position}] ({db.name}); it builds: {', '.join(supported)}"
                )
            # Quantisation, on_disk and server-dependent limits (apps/vdb/capabilities.py).
            problems = collection_problems(db, position, self.collection, self.cluster)
            if problems:
                raise ValueError("; ".join(problems))
        return self

    def pilot_databases(self) -> list[DatabaseSettings]:
        """Databases that run as pilot jobs under ``cluster`` (first entry per name). In-process engines
        (Qdrant edge) have no server: they run inside their clients, on the client block."""
        seen: dict[str, DatabaseSettings] = {}
        for db in self.databases:
            if not getattr(db, "in_process", False):
                seen.setdefault(db.name, db)
        return list(seen.values())
