"""What a sweep point needs before it is queued: memory per database rank and per node, disk on its storage
medium, and the time its upload and index build take, from figures measured here.

The model, per point (``estimate``): the rows it loads (``vdb.insert.rows``, else the whole dataset) are
spread evenly over its ranks (``cluster.workers``; one rank locally). A rank holds, per vector, its float32
vector ``memory_copies`` times in memory and ``disk_copies`` times on disk, plus the HNSW graph's
layer-0 links (2 M ids of 4 bytes) and an 8-byte id, and ``fixed_mib`` of its own. Figures measured
inside two client processes (Qdrant edge, FAISS) count each mapped copy twice: a server rank (Qdrant's
server on HPC) is one process and gets half. On storage medium
``memory`` the disk bytes live in ``/dev/shm``, that is in memory too. Upload and index rates were
measured at 384 dimensions with one worker on 2 cores; they are scaled by 384 / dimension (both are bound
by the vector bytes and distance computations), for upload multiplied by the workers, and for the index
build (and the upload of an engine that builds while it uploads) by each rank's cores over 2 (linear: the
study measured less, so the estimates are lower bounds on time).

``COSTS`` comes from ``python -m benchmarks.scale`` (HNSW, float32; docs/vector-databases.md, "Resource
plan", gives the run). An index type or quantisation it did not measure uses its engine's HNSW figures,
and the estimate says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apps.vdb import runs_in_process

MEASURED_DIM = 384
MEASURED_CORES = 2  # the machine benchmarks/scale measured COSTS on (one worker: every core)
GIB = 2**30


@dataclass(frozen=True)
class EngineCost:
    """One engine's measured cost (HNSW, float32 vectors)."""

    memory_copies: float  # float32 copies of each vector in the rank's resident memory
    disk_copies: float  # float32 copies of each vector in its data directory
    fixed_mib: float  # resident memory of a rank holding no data
    insert_vectors_per_s: float  # one worker, two clients, batches of 1,000, at 384 dimensions
    index_vectors_per_s: float | None  # the deferred HNSW build at 384 dimensions; None: built on upload
    measured_processes: int = 1  # processes whose memory was summed: an in-process engine's two clients


# `python -m benchmarks.scale --sizes 100000 1000000` on the 2-core Xeon (2026-11-26; the run, its load and
# the raw figures: docs/vector-databases.md, "Resource plan"): copies = the slope of memory (disk) between
# the two sizes less the graph, in vectors of 1,536 bytes; fixed = the intercept; rates at 1M. Qdrant
# (edge) and FAISS run inside the two client processes, each holding the data: their copies are both
# clients'. Weaviate builds its graph while it uploads: no separate build.
COSTS: dict[str, EngineCost] = {
    "qdrant": EngineCost(3.33, 0.99, 469, 35_966, 1_498, measured_processes=2),
    "milvus": EngineCost(2.75, 4.36, 918, 12_021, 3_149),
    "weaviate": EngineCost(2.79, 1.35, 248, 722, None),
    "faiss": EngineCost(1.49, 2.02, 1_767, 184_129, 4_031, measured_processes=2),
}


# A client process (a Parsl worker running an insert or query task) holding no data: Python, Parsl's worker,
# this project's stages and the heaviest client library loaded. Measured here (2026-11-26, psutil RSS after
# the imports): pymilvus 186 MiB, qdrant-client 168, weaviate-client 161.
CLIENT_FIXED_MIB = 190
# The driver (``python -m pipeline run``: the DAG, the report) at its peak in benchmarks/scale: 319 MiB at
# both 100,000 and 1,000,000 rows (384 dimensions, FAISS, 2026-11-26: the report reads one row group at a
# time and fetches only the top-k it scores). The estimate adds what the report holds for a point that
# loads a prefix: the exact top-k of that prefix, computed in blocks of ``groundtruth.memory_budget_mb``.
DRIVER_MEASURED_MIB = 320


def client_memory(dim: int, row_group_rows: int, queries: int, k: int) -> float:
    """Peak bytes of one client process: an insert client holds one row group at a time (the Arrow column,
    its NumPy copy and the request being encoded: 3 copies), a query client every query it sends (Arrow and
    NumPy) and their top-k ids and distances; a process runs one of the two at a time."""
    vector = 4 * dim
    insert = 3 * row_group_rows * vector
    query = queries * (2 * vector + k * 12)
    return CLIENT_FIXED_MIB * 2**20 + max(insert, query)


def driver_memory(prefix_truth_budget_mib: float | None, fetched_bytes: float = 0) -> float:
    """Peak bytes of the driver: the measured figure, plus the report's prefix ground truth when a point
    loads fewer rows than the dataset (``None``: none does), plus the base vectors the report fetches to
    score the results (every returned id and the exact top-k: up to 2 x queries x k vectors)."""
    return (DRIVER_MEASURED_MIB + (prefix_truth_budget_mib or 0)) * 2**20 + fetched_bytes


@dataclass(frozen=True)
class PointEstimate:
    """What one point needs, and on what its figures rest."""

    label: str
    rows: int
    dim: int
    ranks: int
    ranks_per_node: int
    medium: str
    rank_memory: float  # bytes
    node_memory: float  # bytes: its ranks' memory, plus their data when the medium is memory
    node_disk: float  # bytes on the medium, per node
    upload_s: float
    index_s: float | None  # None: the engine builds its index during the upload
    basis: str  # which measured figures were used
    client_memory: float | None = None  # bytes per client process; None: the engine runs in the client
    client_processes: int | None = None  # client processes on one client node

    def row(self) -> list[str]:
        """The plan table's cells."""
        return [
            self.label,
            f"{self.rows:,} x {self.dim}",
            f"{self.ranks} ({self.ranks_per_node}/node)",
            gib(self.rank_memory),
            gib(self.node_memory),
            f"{gib(self.node_disk)} {self.medium}",
            f"{gib(self.client_memory)} x {self.client_processes}" if self.client_memory else "in rank",
            duration(self.upload_s),
            duration(self.index_s) if self.index_s is not None else "in upload",
            self.basis,
        ]


def gib(n_bytes: float) -> str:
    """``12.3 GiB`` (or MiB below one GiB)."""
    return f"{n_bytes / GIB:,.1f} GiB" if n_bytes >= GIB else f"{n_bytes / 2**20:,.0f} MiB"


def duration(seconds: float) -> str:
    """``45 s``, ``12 min`` or ``3.4 h``."""
    if seconds < 120:
        return f"{seconds:,.0f} s"
    return f"{seconds / 60:,.0f} min" if seconds < 7200 else f"{seconds / 3600:,.1f} h"


def estimate(
    point: Any, rows: int, dim: int, medium: str, ranks: int, ranks_per_node: int, cores: int | None = None
) -> PointEstimate | None:
    """The estimate of a sweep point (``apps.vdb.sweep.SweepPoint``) loading ``rows`` of ``dim``; None for an
    engine without measured figures. ``cores``: each rank's cores (None: as measured); the index build is
    taken to speed up linearly with them (the study measured less, so the time is a lower bound)."""
    cost = COSTS.get(point.database)
    if cost is None:
        return None
    collection = point.config.collection
    basis = f"{point.database} hnsw"
    if collection.index_type != "hnsw" or collection.quantization not in (None, "none"):
        basis += f" ({collection.index_type}, {collection.quantization or 'float32'}: not measured)"
    rows_per_rank = -(-rows // ranks)
    ranks_per_node = min(ranks_per_node, ranks)
    vector = 4 * dim
    graph = 2 * collection.hnsw_m * 4 + 8
    # Measured inside two client processes, each mapping the same files: a server rank is one process.
    share = 1 if runs_in_process(point.settings) else cost.measured_processes
    rank_memory = (cost.fixed_mib * 2**20 + rows_per_rank * cost.memory_copies * vector) / share
    rank_memory += rows_per_rank * graph
    rank_disk = rows_per_rank * (cost.disk_copies * vector + graph)
    node_disk = rank_disk * ranks_per_node
    node_memory = rank_memory * ranks_per_node + (node_disk if medium == "memory" else 0)
    scale = MEASURED_DIM / dim
    speedup = max(1.0, (cores or MEASURED_CORES) / MEASURED_CORES)
    # An engine that builds its graph while it uploads (Weaviate) uploads as fast as it indexes.
    upload_speedup = speedup if cost.index_vectors_per_s is None else 1.0
    upload_s = rows / (cost.insert_vectors_per_s * scale * ranks * upload_speedup)
    index_s = (
        rows_per_rank / (cost.index_vectors_per_s * scale * speedup) if cost.index_vectors_per_s else None
    )
    return PointEstimate(
        point.label, rows, dim, ranks, ranks_per_node, medium, rank_memory, node_memory, node_disk,
        upload_s, index_s, basis,
    )  # fmt: skip
