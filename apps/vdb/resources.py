"""What a sweep point needs before it is queued: memory per database rank and per node, disk on its storage
medium, and the time its upload and index build take, from figures measured here.

The model, per point (``estimate``): the rows it loads (``vdb.insert.rows``, else the whole dataset) are
spread evenly over its ranks (``cluster.workers``; locally one, or a local cluster's processes, which
share this machine's cores and so upload no faster than one). A rank holds, per vector, its float32
vector ``memory_copies`` times in memory and ``disk_copies`` times on disk, plus its index's links
(``link_bytes``: an HNSW graph's layer-0 links, 2 M ids of 4 bytes) and an 8-byte id, and ``fixed_mib``
of its own. A quantised index's codes are counted in its copies (an int8 copy is a quarter of one), so
they scale with the dimension as its vectors do. Figures measured inside two client processes (Qdrant
edge, FAISS) count each mapped copy twice: a server rank (Qdrant's server on HPC) is one process and gets
half. On storage medium ``memory`` the disk bytes live in ``/dev/shm``, that is in memory too. Upload
and index rates were measured at 384 dimensions with one worker on 2 cores; they are scaled by 384 /
dimension (both are bound by the vector bytes and distance computations), for upload multiplied by the
workers, and for the index build (and the upload of an engine that builds while it uploads) by each
rank's cores over 2 (linear: the study measured less, so the estimates are lower bounds on time).

``COSTS`` comes from ``python -m benchmarks.scale``: one row per engine x index type x quantisation
(docs/vector-databases.md, "Resource plan", gives the runs). A combination it did not measure uses its
engine's HNSW float32 figures, and the estimate says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apps.vdb import runs_in_process
from core.format import duration, size

MEASURED_DIM = 384
MEASURED_CORES = 2  # the machine benchmarks/scale measured COSTS on (one worker: every core)
GIB = 2**30


@dataclass(frozen=True)
class EngineCost:
    """One engine's measured cost with one index type and quantisation."""

    memory_copies: float  # float32 copies of each vector in the rank's resident memory (codes included)
    disk_copies: float  # float32 copies of each vector in its data directory
    fixed_mib: float  # resident memory of a rank holding no data
    insert_vectors_per_s: float  # one worker, two clients, batches of 1,000, at 384 dimensions
    index_vectors_per_s: float | None  # the deferred index build at 384 dimensions; None: built on upload
    measured_processes: int = 1  # processes whose memory was summed: an in-process engine's two clients


# Index types whose per-vector links the model counts apart from the copies (they grow with M, not with the
# dimension): an HNSW graph's layer-0 links, 2 M ids of 4 bytes. Weaviate's dynamic index is HNSW past its
# threshold. Other types keep only an 8-byte id beside their vectors (a DiskANN graph is in its disk copies).
LINKED = ("hnsw", "dynamic")


def link_bytes(index_type: str, hnsw_m: int) -> int:
    """Bytes per vector besides its copies: the id, and the HNSW layer-0 links of a linked index type."""
    return 8 + (2 * hnsw_m * 4 if index_type in LINKED else 0)


# `python -m benchmarks.scale`, on the 2-core Xeon (the runs, their load and the raw figures:
# docs/vector-databases.md, "Resource plan"): copies = the slope of memory (disk) between two sizes less the
# links (M 16), in vectors of 1,536 bytes; fixed = the intercept; rates at the larger size. Qdrant (edge)
# and FAISS run inside the two client processes, each holding the data: their copies are both clients'.
# Weaviate builds its graph while it uploads: no separate build. Keys: (engine, index type, quantisation).
COSTS: dict[tuple[str, str, str], EngineCost] = {
    # HNSW float32: `--sizes 100000 1000000` (2026-11-26).
    ("qdrant", "hnsw", "none"): EngineCost(3.33, 0.99, 469, 35_966, 1_498, measured_processes=2),
    ("milvus", "hnsw", "none"): EngineCost(2.75, 4.36, 918, 12_021, 3_149),
    ("weaviate", "hnsw", "none"): EngineCost(2.79, 1.35, 248, 722, None),
    # FAISS HNSW: `--sizes 100000 1000000 --engines faiss` (2026-11-27), after its build sized the vector
    # storage once (apps/vdb/faiss/build.reserve_storage): no more growth copies in the peak.
    ("faiss", "hnsw", "none"): EngineCost(1.17, 2.02, 840, 183_953, 2_746, measured_processes=2),
    # Every other index x quantisation built here: `--matrix` (20,000 and 100,000 rows, 2026-11-27; FAISS's:
    # `--matrix --sizes 100000 1000000 --engines faiss`, 2026-11-27 19:16-19:31), each figure its ratio to the
    # engine's HNSW float32 in that run times the row above (one anchor per engine).
    ("qdrant", "hnsw", "scalar"): EngineCost(4.73, 1.26, 596, 42_800, 5_333, measured_processes=2),
    ("qdrant", "hnsw", "pq"): EngineCost(4.2, 1.05, 718, 43_519, 1_064, measured_processes=2),
    ("qdrant", "hnsw", "bq"): EngineCost(4.53, 1.02, 736, 40_282, 6_067, measured_processes=2),
    ("qdrant", "flat", "none"): EngineCost(2.46, 1.14, 732, 39_203, None, measured_processes=2),
    ("milvus", "ivf_flat", "none"): EngineCost(6.21, 4.4, 569, 12_021, 7_148),
    ("milvus", "ivf_flat", "scalar"): EngineCost(3.05, 3.36, 771, 12_021, 8_534),
    ("milvus", "ivf_pq", "none"): EngineCost(5.58, 3.14, 542, 10_699, 472),
    ("milvus", "ivf_pq", "pq"): EngineCost(3.93, 3.14, 744, 11_300, 472),
    ("milvus", "flat", "none"): EngineCost(4.62, 3.05, 670, 10_098, None),
    ("weaviate", "hnsw", "scalar"): EngineCost(2.62, 1.62, 213, 866, None),
    ("weaviate", "hnsw", "pq"): EngineCost(2.09, 1.61, 265, 368, None),
    ("weaviate", "hnsw", "bq"): EngineCost(1.45, 1.47, 335, 845, None),
    ("weaviate", "flat", "none"): EngineCost(2.37, 2.03, 451, 10_245, None),
    ("weaviate", "flat", "bq"): EngineCost(2.65, 2.16, 345, 10_079, None),
    ("weaviate", "dynamic", "none"): EngineCost(2.23, 1.35, 382, 606, None),
    ("weaviate", "dynamic", "bq"): EngineCost(1.06, 1.47, 402, 838, None),
    ("faiss", "ivf_flat", "none"): EngineCost(1.75, 2.02, 554, 196_830, 93_831, measured_processes=2),
    ("faiss", "ivf_pq", "none"): EngineCost(0.25, 1.07, 966, 193_151, 40_751, measured_processes=2),
    ("faiss", "flat", "none"): EngineCost(1.32, 2.02, 974, 187_632, 84_302, measured_processes=2),
}


def engine_cost(database: str, index_type: str, quantization: str | None) -> tuple[EngineCost | None, str]:
    """The measured cost of ``database`` building ``index_type`` with ``quantization``, and the basis the
    plan names; a combination not measured falls back to the engine's HNSW float32 figures, saying so
    (None: the engine has no measured figures)."""
    quantization = quantization or "none"
    measured = COSTS.get((database, index_type, quantization))
    if measured is not None:
        return measured, " ".join(part for part in (database, index_type, quantization) if part != "none")
    fallback = COSTS.get((database, "hnsw", "none"))
    vectors = "float32" if quantization == "none" else quantization
    return fallback, f"{database} hnsw ({index_type}, {vectors}: not measured)"


# A client process (a Parsl worker running an insert or query task) holding no data: Python, Parsl's worker,
# this project's stages and the heaviest client library loaded. Measured here (2026-11-26, psutil RSS after
# the imports): pymilvus 186 MiB, qdrant-client 168, weaviate-client 161.
CLIENT_FIXED_MIB = 190
# The driver (``python -m pipeline run``: the DAG, the report) at its peak in benchmarks/scale: 319 MiB at
# both 100,000 and 1,000,000 rows (384 dimensions, FAISS, 2026-11-26: the report reads one row group at a
# time and fetches only the top-k it scores). The estimate adds what the report holds for a point that
# loads a prefix: the exact top-k of that prefix, computed in blocks of ``groundtruth.memory_budget_mb``.
DRIVER_MEASURED_MIB = 320


# Seconds a local point spends outside its upload, index build and measured query windows: its server's start
# (deploy_s) and stop, the collection's creation, the searchable wait, each setting's warm-up. Per engine, the
# median over its points of one `python -m pipeline run configs/local-engines.yaml` on the 2-core Xeon
# (2026-11-29, an empty workdir, load 0.5-1.6, 4 query settings of 2 s per point): a point's wall time less
# its upload_s, index_s and window_s. A pilot job's start on HPC is its queue wait: not estimated.
LOCAL_POINT_OVERHEAD_S = {
    "qdrant": 1.5,  # edge, in process (1.2-1.6)
    "milvus": 20.1,  # standalone: 2-3 s to start, 3.5 s until searchable, its stop (19.6-20.2)
    "weaviate": 9.9,  # 3.5 s to start, 3 s until its queue drains (9.8-10.0)
    "pgvector": 5.2,  # 0.5-0.9 s to start (5.0-5.3)
    "lancedb": 2.5,  # in process (1.4-3.6)
    "faiss": 1.5,  # in process (1.3-9.0: IVF-PQ's training fell outside its index_s)
}


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
    builds_index: bool = True  # False: a flat index, nothing to build

    def row(self) -> list[str]:
        """The plan table's cells."""
        return [
            self.label,
            f"{self.rows:,} x {self.dim}",
            f"{self.ranks} ({self.ranks_per_node}/node)",
            size(self.rank_memory),
            size(self.node_memory),
            f"{size(self.node_disk)} {self.medium}",
            f"{size(self.client_memory)} x {self.client_processes}" if self.client_memory else "in rank",
            duration(self.upload_s),
            self.index_cell(),
            self.basis,
        ]

    def index_cell(self) -> str:
        """The index build's time; ``in upload`` for an engine that builds while it uploads, ``none`` for a
        flat index (it has nothing to build)."""
        if self.index_s is not None:
            return duration(self.index_s)
        return "in upload" if self.builds_index else "none"


def estimate(
    point: Any, rows: int, dim: int, medium: str, ranks: int, ranks_per_node: int, cores: int | None = None
) -> PointEstimate | None:
    """The estimate of a sweep point (``apps.vdb.sweep.SweepPoint``) loading ``rows`` of ``dim``; None for an
    engine without measured figures. ``cores``: each rank's cores (None: as measured); the index build is
    taken to speed up linearly with them (the study measured less, so the time is a lower bound)."""
    collection = point.config.collection
    cost, basis = engine_cost(point.database, collection.index_type, collection.quantization)
    if cost is None:
        return None
    rows_per_rank = -(-rows // ranks)
    ranks_per_node = min(ranks_per_node, ranks)
    vector = 4 * dim
    graph = link_bytes(collection.index_type, collection.hnsw_m)
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
        upload_s, index_s, basis, builds_index=collection.index_type != "flat",
    )  # fmt: skip
