"""The FAISS client: a collection is a directory the insert, index and query tasks share through the disk.

``<data_dir>/<collection>/`` holds ``collection.json`` (dimension and metric), ``rows/`` (the batches the
insert stage stored, :mod:`~apps.vdb.faiss.rows`), and after the index stage ``index.faiss`` (written
atomically) with ``index.json`` (what was built, from how many rows, in how long).

Searchable means: stored. ``insert`` returns once its batch is in the row store (``visible_on_return``);
until an index is built, ``search`` scans the stored rows exactly (an ``IndexFlat`` over them), so upload
time for FAISS is the time to durable storage. ``build_index`` trains (IVF), adds every row and writes the
index; ``search`` loads it once per process (shared by the process's clients and released when the last
of them closes) and reloads only when the file changes. An insert after a build removes the index (it no
longer covers every row): search is exact again until the next build.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from apps.vdb.base import Client, CollectionSpec, DatabaseError, Endpoints, SearchResult, StorageStats
from apps.vdb.faiss import build
from apps.vdb.faiss.rows import RowStore
from apps.vdb.faiss.settings import FaissSettings
from core import memory
from core.store import atomic_write_json


def cpu_threads(settings: FaissSettings) -> int:
    """OpenMP threads: the setting, or every CPU this process may run on."""
    return settings.threads or len(os.sched_getaffinity(0))


class FaissClient(Client):
    """One collection under the deployment's data dir, in this process."""

    visible_on_return = True  # a batch is stored (and found by the exact scan) when insert returns

    def __init__(self, settings: FaissSettings, endpoints: Endpoints) -> None:
        self.settings, self.endpoints = settings, endpoints
        self.spec: CollectionSpec | None = None
        self.store: RowStore | None = None
        self.held: dict[str, tuple[tuple, Any]] = {}  # file key -> (version, index) this client searches

    # -- collection --------------------------------------------------------------------------------
    def _dir(self, spec: CollectionSpec) -> Path:
        if not self.endpoints.data_dir:
            raise DatabaseError("faiss: the endpoints name no data directory")
        return Path(self.endpoints.data_dir) / spec.name

    def _bound(self) -> tuple[CollectionSpec, RowStore]:
        if self.spec is None or self.store is None:
            raise DatabaseError("faiss: call create_collection first (it attaches to an existing collection)")
        return self.spec, self.store

    def create_collection(self, spec: CollectionSpec, *, recreate: bool = False) -> None:
        """Create (or attach to) the collection directory; an existing one must match dimension and metric."""
        build.check_spec(spec)
        directory = self._dir(spec)
        if recreate and directory.exists():
            build.LOADED.drop(str(directory) + os.sep)
            shutil.rmtree(directory)
        described = directory / "collection.json"
        if described.exists():
            have = json.loads(described.read_text())
            if (have["dim"], have["metric"]) != (spec.dim, spec.metric):
                raise DatabaseError(
                    f"faiss collection {spec.name!r} exists with dimension {have['dim']} and metric "
                    f"{have['metric']}, but dimension {spec.dim} and metric {spec.metric} were requested "
                    "(use another name or recreate it)"
                )
        else:
            (directory / "rows").mkdir(parents=True, exist_ok=True)
            atomic_write_json(described, {"dim": spec.dim, "metric": spec.metric})
        self.spec, self.store = spec, RowStore(directory / "rows", spec.dim)

    def _vectors(self, what: str, array: np.ndarray) -> np.ndarray:
        dim = self._bound()[0].dim
        array = np.ascontiguousarray(array, dtype=np.float32)
        if array.ndim != 2 or array.shape[1] != dim:
            raise DatabaseError(f"faiss: {what} have shape {array.shape}, collection dimension is {dim}")
        return array

    # -- insert --------------------------------------------------------------------------------------
    def insert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Store one batch (atomic; a retry of the same ids overwrites it) and retire a built index."""
        spec, store = self._bound()
        vectors = self._vectors("vectors", vectors)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if ids.shape != (len(vectors),) or (ids < 0).any():
            raise ValueError(f"faiss: need {len(vectors)} non-negative row ids, got shape {ids.shape}")
        if not len(ids):
            return
        store.write(ids, vectors, fsync=self.settings.fsync)
        directory = self._dir(spec)
        for name in (build.INDEX_FILE, build.META_FILE):  # the index no longer covers every row
            with contextlib.suppress(FileNotFoundError):
                (directory / name).unlink()

    def wait_searchable(self, expected: int, timeout: float) -> None:
        """Stored rows are searchable (exactly, until an index is built): wait until ``expected`` are."""
        missing = "faiss: only {seen} of {expected} rows stored after {timeout:.0f}s"
        self.wait_for_count(expected, timeout, 0.2, missing)

    # -- index ---------------------------------------------------------------------------------------
    def build_index(self, timeout: float) -> None:
        """Train (IVF, on a seeded sample), size the vector storage once (hnsw, flat), add every stored row,
        write the index atomically.

        FAISS builds in native code that cannot be interrupted, so ``timeout`` is not enforced here.
        """
        import faiss

        spec, store = self._bound()
        directory, s = self._dir(spec), self.settings
        build.remove_stale_temps(directory)
        faiss.omp_set_num_threads(cpu_threads(s))
        listing = store.listing()
        rows = store.count(listing)
        if rows == 0:
            raise DatabaseError(f"faiss: collection {spec.name!r} holds no rows to index")
        index, times, trained_on = build.new_index(spec), {}, None
        started = time.monotonic()
        if spec.index_type in build.IVF:
            trained_on = build.train_rows(spec, rows, s.train_rows)
            index.train(build.prepare(store.sample(listing, trained_on, s.train_seed), spec))
        times["train_s"] = time.monotonic() - started
        build.reserve_storage(index, rows)
        for ids, vectors in store.chunks(listing, s.add_rows):
            index.add_with_ids(build.prepare(vectors, spec), ids)
        times["add_s"] = time.monotonic() - started - times["train_s"]
        if index.ntotal != rows:
            raise DatabaseError(f"faiss: the index holds {index.ntotal} rows, the store {rows}")
        if store.listing() != listing:
            raise DatabaseError("faiss: rows were inserted while the index was built; build it again")
        index_bytes = build.write_atomic(index, directory / build.INDEX_FILE)
        meta = {
            "index_type": spec.index_type,
            "metric": spec.metric,
            "rows": rows,
            "train_rows": trained_on,
            "index_bytes": index_bytes,
            "threads": cpu_threads(s),
            "faiss_version": faiss.__version__,
            **{k: round(v, 6) for k, v in times.items()},
        }
        atomic_write_json(directory / build.META_FILE, meta)

    # -- search --------------------------------------------------------------------------------------
    def _index(self, spec: CollectionSpec) -> tuple[Any, str]:
        """The built index (loaded once per process), or an exact scan of the stored rows; and its type."""
        import faiss

        path = self._dir(spec) / build.INDEX_FILE
        try:
            info = path.stat()
        except FileNotFoundError:
            return self._exact(spec), "flat"
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size, spec.on_disk)

        def load() -> Any:
            return faiss.read_index(str(path), build.read_flags(spec.index_type, spec.on_disk))

        index = self._hold(str(path), stamp, load)
        built = build.kind(index)
        if built != spec.index_type or index.metric_type != build.metric_type(spec) or index.d != spec.dim:
            raise DatabaseError(
                f"faiss: {path} holds a {built} index (dimension {index.d}), but the collection asks for "
                f"{spec.index_type} with metric {spec.metric} and dimension {spec.dim}: run build_index"
            )
        return index, built

    def _exact(self, spec: CollectionSpec) -> Any:
        """An exact index over the stored rows (before a build), cached until the store changes."""
        import faiss

        store = self._bound()[1]
        listing = store.listing()

        def load() -> Any:
            index = faiss.IndexIDMap2(faiss.IndexFlat(spec.dim, build.metric_type(spec)))
            for ids, vectors in store.chunks(listing, self.settings.add_rows):
                index.add_with_ids(build.prepare(vectors, spec), ids)
            return index

        return self._hold(str(store.directory) + os.sep + "exact", tuple(listing), load)

    def _hold(self, key: str, stamp: tuple, load: Any) -> Any:
        """The shared index of ``key`` at ``stamp``, kept by this client until it closes."""
        held = self.held.get(key)
        if held is not None and held[0] == stamp:
            return held[1]
        self.held.pop(key, None)  # an older version is released before the new one is loaded
        index = build.LOADED.get(key, stamp, load)
        self.held[key] = (stamp, index)
        return index

    def search(self, queries: np.ndarray, k: int, ef: int | None) -> SearchResult:
        """One ``search`` call for the batch; ``ef`` sets efSearch (hnsw) or nprobe (ivf)."""
        import faiss

        spec = self._bound()[0]
        queries = build.prepare(self._vectors("queries", queries), spec)
        index, built = self._index(spec)
        faiss.omp_set_num_threads(cpu_threads(self.settings))  # per calling thread in OpenMP
        params = build.search_params(built, ef, spec.ivf_nlist, k)
        scores, ids = index.search(queries, k, params=params)
        scores[ids < 0] = np.nan  # FAISS pads a short list with id -1 and an infinite distance
        return SearchResult(
            ids=ids.astype(np.int64, copy=False), scores=scores.astype(np.float32, copy=False)
        )

    # -- bookkeeping ---------------------------------------------------------------------------------
    def count(self) -> int:
        """Distinct row ids stored."""
        return self._bound()[1].count()

    def describe(self) -> StorageStats:
        """Rows, bytes on disk (row store + index), and what the last build recorded."""
        from apps.vdb.process import directory_bytes

        spec, store = self._bound()
        directory = self._dir(spec)
        listing = store.listing()
        meta_file = directory / build.META_FILE
        meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
        index_file = directory / build.INDEX_FILE
        details: dict[str, str | int | float | bool | None] = {
            "data_bytes": store.data_bytes(listing),
            "index_bytes": index_file.stat().st_size if index_file.exists() else 0,
            "batch_files": len(listing),
            "on_disk": spec.on_disk,
        }
        details.update({k: v for k, v in meta.items() if k != "index_bytes"})
        return StorageStats(
            count=store.count(listing), disk_bytes=directory_bytes(directory), details=details
        )

    def close(self) -> None:
        """Detach and release the loaded index (freed when no other client of the process holds it), and
        return the freed memory to the system, not to this worker's next task (:mod:`core.memory`)."""
        self.spec = self.store = None
        self.held.clear()
        memory.release_freed_memory()


def connect(settings: FaissSettings, endpoints: Endpoints, client_index: int = 0) -> Client:
    """A client on the collection directory (every client index reads the same files)."""
    return FaissClient(settings, endpoints)
