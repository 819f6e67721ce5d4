"""FAISS indexes: what each index type is built from, the checks before a build, atomic index files, loading.

Index types (``vdb.collection.index_type``), each wrapped in ``IndexIDMap2`` so results are dataset row ids:

* ``hnsw``: ``IndexHNSWFlat`` (M = ``hnsw_m``, efConstruction = ``ef_construction``; ef at search time);
* ``ivf_flat``: ``IndexIVFFlat`` over a flat coarse quantiser (``ivf_nlist`` lists; nprobe at search time);
* ``ivf_pq``: ``IndexIVFPQ`` (``pq_m`` sub-vectors of ``pq_bits`` bits; ``pq_m`` must divide the dimension);
* ``flat``: ``IndexFlat``, the exact scan.

Metrics: ``l2`` (FAISS reports squared distances), ``ip``, and ``cosine`` as inner product over vectors
normalised to unit length (at build and at query time). The index file is written to a temporary name
beside ``index.faiss`` and renamed into place, so a reader finds the previous complete index, the new
complete index, or none; never a partial one.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from apps.vdb.base import CollectionSpec, DatabaseError

INDEX_FILE = "index.faiss"
META_FILE = "index.json"
IVF = ("ivf_flat", "ivf_pq")
# FAISS's k-means uses at most this many training points per centroid (ClusteringParameters).
POINTS_PER_LIST = 256


def check_spec(spec: CollectionSpec) -> None:
    """DatabaseError naming the ``vdb.collection`` field FAISS cannot build as asked."""
    at = "vdb.collection."
    if spec.index_type not in ("hnsw", "ivf_flat", "ivf_pq", "flat"):
        raise DatabaseError(
            f"faiss builds {at}index_type hnsw, ivf_flat, ivf_pq or flat, not {spec.index_type!r}"
        )
    if spec.index_type == "ivf_pq" and spec.dim % spec.pq_m:
        raise DatabaseError(
            f"faiss ivf_pq: {at}pq_m = {spec.pq_m} does not divide the dimension {spec.dim} "
            "(each product-quantiser sub-vector must have dim / pq_m components)"
        )
    if spec.quantization != "none":
        raise DatabaseError(
            f"faiss: {at}quantization {spec.quantization!r} is not built here; use index_type ivf_pq for "
            "product quantisation, or quantization: none"
        )
    if spec.shards != 1:
        raise DatabaseError(f"faiss is one index in one process: set {at}shards to 1, not {spec.shards}")
    if not spec.deferred_indexing:
        raise DatabaseError(
            f"faiss has no background indexer: the index is built by the index stage after the upload; "
            f"set {at}deferred_indexing to true"
        )


def train_rows(spec: CollectionSpec, stored: int, configured: int | None) -> int:
    """Rows the IVF training sample holds; DatabaseError when there are too few for the lists or codes."""
    rows = min(stored, configured or POINTS_PER_LIST * spec.ivf_nlist)
    where = "vdb.databases[faiss].train_rows" if configured else f"{stored} stored rows"
    if rows < spec.ivf_nlist:
        raise DatabaseError(
            f"faiss {spec.index_type}: vdb.collection.ivf_nlist = {spec.ivf_nlist} lists need at least as "
            f"many training rows, and the sample has {rows} ({where})"
        )
    if spec.index_type == "ivf_pq" and rows < 2**spec.pq_bits:
        raise DatabaseError(
            f"faiss ivf_pq: vdb.collection.pq_bits = {spec.pq_bits} means {2**spec.pq_bits} centroids per "
            f"sub-vector, but the training sample has {rows} rows ({where})"
        )
    return rows


def metric_type(spec: CollectionSpec) -> int:
    """FAISS's metric constant: inner product for ip and (normalised) cosine, L2 otherwise."""
    import faiss

    return faiss.METRIC_L2 if spec.metric == "l2" else faiss.METRIC_INNER_PRODUCT


def new_index(spec: CollectionSpec) -> Any:
    """An empty, untrained index of ``spec.index_type`` in an ``IndexIDMap2``."""
    import faiss

    check_spec(spec)
    metric, d = metric_type(spec), spec.dim
    if spec.index_type == "hnsw":
        inner = faiss.IndexHNSWFlat(d, spec.hnsw_m, metric)
        inner.hnsw.efConstruction = spec.ef_construction
    elif spec.index_type == "flat":
        inner = faiss.IndexFlat(d, metric)
    else:
        quantizer = faiss.IndexFlat(d, metric)
        if spec.index_type == "ivf_flat":
            inner = faiss.IndexIVFFlat(quantizer, d, spec.ivf_nlist, metric)
        else:
            inner = faiss.IndexIVFPQ(quantizer, d, spec.ivf_nlist, spec.pq_m, spec.pq_bits, metric)
    return faiss.IndexIDMap2(inner)  # the Python wrappers keep the inner index and quantiser alive


def vector_storage(index: Any) -> Any | None:
    """The flat vector storage (``IndexFlatCodes``) of an ``hnsw`` or ``flat`` index from :func:`new_index`;
    None for the IVF types, whose vectors live in their inverted lists."""
    import faiss

    inner = faiss.downcast_index(index.index)
    storage = faiss.downcast_index(inner.storage) if isinstance(inner, faiss.IndexHNSW) else inner
    return storage if isinstance(storage, faiss.IndexFlatCodes) else None


def reserve_storage(index: Any, rows: int) -> None:
    """Size the vector storage of an ``hnsw`` or ``flat`` index (from :func:`new_index`) for ``rows`` before
    the build adds them; other types are left alone.

    FAISS keeps those vectors in one std::vector that grows as rows are added, doubling: each growth copies
    every vector stored so far into a new block while the old one is still held. A chunked build's peak
    then held up to two copies, and whether a 1 s memory sample caught a growth decided its measured peak
    (2,776 to 4,136 MiB at 1M x 384 in four runs of benchmarks.scale). Resizing to the final size and back to
    0 keeps the capacity (a std::vector never shrinks it), so the adds fill that one block in place.
    """
    storage = vector_storage(index)
    if storage is not None:
        storage.codes.resize(rows * storage.code_size)
        storage.codes.resize(0)


def kind(index: Any) -> str:
    """The index type name of a loaded index (``IndexIDMap2`` around one of ours)."""
    import faiss

    inner = faiss.downcast_index(index.index) if hasattr(index, "id_map") else index
    names = {
        faiss.IndexHNSWFlat: "hnsw",
        faiss.IndexIVFFlat: "ivf_flat",
        faiss.IndexIVFPQ: "ivf_pq",
        faiss.IndexFlat: "flat",
        faiss.IndexFlatL2: "flat",
        faiss.IndexFlatIP: "flat",
    }
    return names.get(type(inner), type(inner).__name__)


def prepare(vectors: np.ndarray, spec: CollectionSpec) -> np.ndarray:
    """float32, C-contiguous, and unit length for cosine (a copy then; the input is never changed)."""
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if spec.metric == "cosine":
        vectors = vectors.copy()
        faiss.normalize_L2(vectors)
    return vectors


def write_atomic(index: Any, path: Path) -> int:
    """Write ``index`` to ``path`` through a temporary file beside it (fsynced, then renamed); its bytes.

    A write that fails or is interrupted leaves ``path`` as it was and removes the temporary file; a
    temporary file left by a killed process is never read (only ``path`` is).
    """
    import faiss

    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        faiss.write_index(index, str(tmp))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path.stat().st_size


def remove_stale_temps(directory: Path) -> None:
    """Delete temporary index files left by writers that were killed (never read, only wasted space)."""
    for tmp in directory.glob(f".{INDEX_FILE}.*.tmp"):
        with contextlib.suppress(OSError):
            tmp.unlink()


def read_flags(index_type: str, on_disk: bool) -> int:
    """``read_index`` flags: on disk, IVF lists are memory-mapped (``IO_FLAG_MMAP``: OnDiskInvertedLists)
    and the flat vector storage of hnsw/flat as well (``IO_FLAG_MMAP_IFC``; the HNSW graph stays in
    memory)."""
    import faiss

    if not on_disk:
        return 0
    return faiss.IO_FLAG_MMAP if index_type in IVF else faiss.IO_FLAG_MMAP_IFC


def search_params(index_type: str, ef: int | None, nlist: int, k: int) -> Any:
    """Per-call search parameters for the ``ef`` knob (``SEARCH_KNOB``): efSearch, raised to ``k`` (FAISS
    would return short lists below it; hnswlib and Qdrant search with max(ef, k) too), or nprobe (capped
    at the list count); None for flat or the engine's default."""
    import faiss

    if index_type == "hnsw":  # None: FAISS's default efSearch, 16
        return faiss.SearchParametersHNSW(efSearch=max(int(ef or 16), k))
    if ef is None or index_type == "flat":
        return None
    return faiss.SearchParametersIVF(nprobe=max(1, min(int(ef), nlist)))


class Loaded:
    """Indexes loaded in this process, shared by its clients while any of them holds one.

    Weakly held: a client keeps the index it searches (strong reference) until it closes, so a query sweep
    loads it once, and the memory is returned when the last client of the process closes, not kept in a
    worker process for the databases that run after this one.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: weakref.WeakValueDictionary[tuple[str, tuple], Any] = weakref.WeakValueDictionary()

    def get(self, key: str, stamp: tuple, load: Any) -> Any:
        """The index loaded under ``key`` from the file version ``stamp``, else ``load()`` (then shared)."""
        with self.lock:
            index = self.items.get((key, stamp))
            if index is None:
                index = load()
                self.items[(key, stamp)] = index
            return index

    def drop(self, prefix: str) -> None:
        """Stop sharing every index loaded under keys starting with ``prefix`` (a collection, a data dir)."""
        with self.lock:
            for item in [k for k in self.items if k[0].startswith(prefix)]:
                self.items.pop(item, None)


LOADED = Loaded()
