"""The ground-truth stage: exact top-k of every query over all dataset parts, streamed.

The base vectors stream through in blocks sized to ``memory_budget_mb``; a running top-k is merged block by
block, so memory does not depend on the dataset size. A float32 kernel proposes each block's candidates:
FAISS's brute-force kernels on the CPU (``apps/dataset/groundtruth/faiss_kernel.py``, what ``IndexFlat``
runs), torch matrix products on a GPU (cuda, xpu; ``apps/dataset/groundtruth/torch_kernel.py``). The top-k
itself and its order are decided in float64 with a fixed summation order
(``apps/dataset/groundtruth/exact_distance.py``,
``apps/dataset/groundtruth/exact_search.py``), ties by (distance, position in the dataset), which is
(distance, id) because ids ascend along the dataset. So the ground truth is the same, ids and distances to the
bit, on every CPU and GPU, for any BLAS kernel, thread count and block size (``docs/groundtruth.md``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from apps.dataset.device import pick_device
from apps.dataset.groundtruth import exact_distance
from apps.dataset.groundtruth import faiss_kernel as groundtruth_faiss
from apps.dataset.groundtruth import torch_kernel as groundtruth_torch
from apps.dataset.groundtruth.exact_search import ExactSearch
from apps.dataset.layout import arrow_to_vectors, iter_vectors
from apps.taskinfo import numeric_libraries, task_context
from core.config import Strict
from core.errors import ArtifactError
from core.store import (
    atomic_write_json,
    complete_manifest,
    read_manifest,
    read_store_table,
    write_parquet_atomic,
)


class GroundTruthConfig(Strict):
    """Exact top-k neighbours of every query."""

    k: int = Field(100, ge=1, le=10000, description="Neighbours per query.")
    metric: Literal["cosine", "ip", "l2"] = Field("cosine", description="Distance for the exact search.")
    memory_budget_mb: int = Field(512, ge=16, description="Upper bound for the distance blocks in memory.")
    device: Literal["auto", "cpu", "cuda", "xpu"] = Field(
        "auto", description="Where the matrix products run."
    )


# 2: FAISS on the CPU; L2 ranked as reported (not squared). 3: ranked by exact float64 distances (the same
# on every machine), the kernels only propose candidates.
STAGE_VERSION = "3"
log = logging.getLogger(__name__)
Engine = Literal["auto", "faiss", "torch"]


def groundtruth_table(query_ids: Any, neighbors: np.ndarray, distances: np.ndarray) -> pa.Table:
    """``groundtruth.parquet``'s layout: ``query_id`` (int64) and, per query, its k neighbour ids (int64)
    and distances (float32) as fixed-size lists, nearest first (``neighbors``: (queries, k))."""
    k = neighbors.shape[1]
    return pa.table(
        {
            "query_id": pa.array(np.asarray(query_ids), pa.int64()),
            "neighbors": pa.FixedSizeListArray.from_arrays(pa.array(neighbors.ravel(), pa.int64()), k),
            "distances": pa.FixedSizeListArray.from_arrays(pa.array(distances.ravel(), pa.float32()), k),
        }
    )


def pick_engine(engine: str, device: str) -> str:
    """``auto``: FAISS on the CPU, torch on an accelerator."""
    if engine == "auto":
        return "faiss" if device == "cpu" else "torch"
    if engine == "faiss" and device != "cpu":
        raise ValueError(f"the FAISS engine runs on the CPU, not on device {device!r}")
    return engine


def block_rows(n_queries: int, dim: int, memory_budget_mb: int, k: int = 100, engine: str = "faiss") -> int:
    """Base rows per block within ``memory_budget_mb`` for ``engine`` (see its module)."""
    if engine == "torch":
        return groundtruth_torch.block_rows(n_queries, dim, memory_budget_mb)
    return groundtruth_faiss.block_rows(n_queries, dim, k, memory_budget_mb)


def _engine_version(engine: str) -> str:
    """The library that proposed the candidates (the exact float64 arithmetic decides)."""
    if engine == "faiss":
        import faiss

        return f"faiss {faiss.__version__}"
    import torch

    return f"torch {torch.__version__}"


def rebatch(
    batches: Iterable[tuple[np.ndarray, np.ndarray]], rows: int
) -> Iterator[tuple[np.ndarray, np.ndarray, bool]]:
    """Regroup (ids, vectors) batches into blocks of at most ``rows`` rows, keeping order.

    Yields (ids, vectors, owned). A lone batch (or a slice of one) passes through uncopied and not owned:
    not ours to change. Blocks joined from several batches are float32 views of one buffer reused from
    block to block (fresh memory for every block costs page faults): owned, so a caller may change them in
    place (the exact search does not), and valid only until the next block is asked for.
    """
    buffer: np.ndarray | None = None
    pending_ids: list[np.ndarray] = []
    pending_vecs: list[np.ndarray] = []
    count = 0

    def join() -> tuple[np.ndarray, np.ndarray, bool]:
        nonlocal buffer
        if len(pending_ids) == 1:
            return pending_ids[0], pending_vecs[0], False
        dim = pending_vecs[0].shape[1]
        if buffer is None or len(buffer) < count or buffer.shape[1] != dim:
            buffer = np.empty((count, dim), dtype=np.float32)  # a full block's rows, or fewer if no more
        out = buffer[:count]
        np.concatenate(pending_vecs, out=out, casting="unsafe")
        return np.concatenate(pending_ids), out, True

    for ids, vecs in batches:
        if len(ids) != len(vecs):
            raise ValueError(f"a batch holds {len(ids)} ids but {len(vecs)} vectors")
        start = 0
        while start < len(ids):
            take = min(rows - count, len(ids) - start)
            pending_ids.append(ids[start : start + take])
            pending_vecs.append(vecs[start : start + take])
            count += take
            start += take
            if count == rows:
                yield join()
                pending_ids, pending_vecs, count = [], [], 0
    if count:
        yield join()


def exact_topk(
    queries: np.ndarray,
    base: Iterable[tuple[np.ndarray, np.ndarray]],
    k: int,
    metric: str,
    device: str = "cpu",
    memory_budget_mb: int = 512,
    engine: Engine = "auto",
    rows: int | None = None,
    stats: dict[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of ``queries`` over ``base`` batches of (ids, vectors): (ids (Q, k), distances (Q, k)).

    Nearest first, equal distances by position (= id). ``engine``: FAISS (CPU) or torch (any device);
    ``rows``: base rows per block, by default as many as ``memory_budget_mb`` allows; ``stats``, when
    given, receives the engine, the block rows and (FAISS) the block searches and how many were repeats.
    """
    device = pick_device(device)
    engine = pick_engine(engine, device)
    if queries.ndim != 2 or len(queries) == 0:
        raise ValueError(f"queries must be a non-empty (n, dim) array, not shape {queries.shape}")
    search: ExactSearch
    if engine == "faiss":
        search = groundtruth_faiss.FaissExactSearch(queries, k, metric, memory_budget_mb)
    else:
        search = groundtruth_torch.TorchExactSearch(queries, k, metric, device)
    rows = rows or block_rows(len(queries), queries.shape[1], memory_budget_mb, k, engine)
    try:
        for ids, vecs, _owned in rebatch(base, rows):
            search.add(ids, vecs)
    finally:
        search.close()
    if search.repeats:
        log.info("near ties at the k-th place: %d of %d searches repeated", search.repeats, search.searches)
    if stats is not None:
        stats.update(
            engine=engine,
            device=device,
            block_rows=rows,
            block_searches=search.searches,
            repeated_searches=search.repeats,
            rescored_pairs=search.rescored,
        )
    return search.result()


def compute_groundtruth(
    out_dir: str, dataset_dir: str, queries_file: str, groundtruth: GroundTruthConfig
) -> dict[str, Any]:
    """Write ``groundtruth.parquet`` (query_id, neighbors, distances) for every query; return the manifest."""
    out = Path(out_dir)
    if (done := complete_manifest(out)) is not None:
        return {**done, "cached": True}
    started = time.time()
    queries = read_store_table(queries_file, columns=["id", "embedding"])
    query_vectors = arrow_to_vectors(queries.column("embedding"))
    dataset_manifest = read_manifest(Path(dataset_dir))
    if dataset_manifest is None:
        raise ArtifactError(f"{dataset_dir}: dataset is not complete (no manifest.json)")
    if dataset_manifest["dimension"] != query_vectors.shape[1]:
        raise ArtifactError(
            f"queries have dimension {query_vectors.shape[1]} "
            f"but the dataset has {dataset_manifest['dimension']}"
        )
    k = min(groundtruth.k, dataset_manifest["rows"])
    warnings = []
    if k < groundtruth.k:  # the plan refuses this when it knows the rows; here it is said, not hidden
        warnings.append(
            f"groundtruth.k {groundtruth.k} exceeds the dataset's {dataset_manifest['rows']} rows: "
            f"ground truth holds {k} neighbours per query"
        )
        log.warning(warnings[-1])
    device = pick_device(groundtruth.device)
    engine = pick_engine("auto", device)
    rows = block_rows(len(query_vectors), query_vectors.shape[1], groundtruth.memory_budget_mb, k, engine)
    stats: dict[str, Any] = {}
    ids, distances = exact_topk(
        query_vectors,
        iter_vectors(Path(dataset_dir), batch_rows=rows),  # Parquet batches of a block: fewer copies
        k,
        groundtruth.metric,
        device,
        groundtruth.memory_budget_mb,
        engine,
        rows,
        stats,
    )
    table = groundtruth_table(queries.column("id").to_numpy(), ids, distances)
    written = write_parquet_atomic(table, out / "groundtruth.parquet", row_group_rows=4096)
    manifest = {
        "stage": "groundtruth",
        "version": STAGE_VERSION,
        "k": k,
        "k_requested": groundtruth.k,
        "warnings": warnings,
        "metric": groundtruth.metric,
        **stats,
        "engine_version": _engine_version(engine),
        "exact": exact_distance.VERSION,
        "numeric_libraries": numeric_libraries(),  # what proposed the candidates; the result is the same
        "queries": len(query_vectors),
        "base_rows": dataset_manifest["rows"],
        "files": [{"file": "groundtruth.parquet", **written}],
        **task_context(started),
    }
    atomic_write_json(out / "manifest.json", manifest)
    return manifest
