"""LanceDB's client: one table ``(id int64, vector fixed_size_list<float32>[dim])`` in the data directory.

* Inserts are Arrow tables built from the NumPy arrays (no Python object per row). ``insert`` is a
  ``merge_insert`` on ``id`` (a retried batch replaces its rows, never duplicates them); ``insert_new``
  (the first attempt into an empty table) is a plain append.
* LanceDB never indexes while rows arrive: ``build_index`` compacts the upload's fragments, builds the
  configured index over every row and checks that it covers them all.
* ``search(ef)``: for ivf_flat / ivf_pq ``ef`` is nprobes; for ivf_hnsw_sq it is the HNSW ef, with
  ``settings.nprobes`` lists probed; flat is an exhaustive scan. A batch of queries is one LanceDB query
  (it takes several vectors and tags each result row with its ``query_index``).
"""

from __future__ import annotations

import sys
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from apps.vdb.base import Client, CollectionSpec, DatabaseError, Endpoints, SearchResult, StorageStats
from apps.vdb.lancedb import DATABASE
from apps.vdb.lancedb.settings import LanceDBSettings
from apps.vdb.process import directory_bytes

DISTANCE = {"cosine": "cosine", "ip": "dot", "l2": "l2"}  # CollectionSpec.metric -> LanceDB distance type
INDEX_NAME = "vector_idx"
# The quantisation each index type implies; CollectionSpec.quantization must be "none" or this.
IMPLIED = {"ivf_pq": "pq", "ivf_hnsw_sq": "scalar", "ivf_flat": "none", "flat": "none"}


def check_spec(spec: CollectionSpec) -> None:
    """DatabaseError naming the ``vdb.collection`` field LanceDB cannot honour."""
    if spec.index_type not in DATABASE.index_types:
        raise DatabaseError(
            f"lancedb: vdb.collection.index_type {spec.index_type!r} is not built by LanceDB; "
            f"it builds: {', '.join(DATABASE.index_types)}"
        )
    if spec.quantization not in ("none", IMPLIED[spec.index_type]):
        raise DatabaseError(
            f"lancedb: vdb.collection.quantization {spec.quantization!r} does not go with index_type "
            f"{spec.index_type!r} (use none or {IMPLIED[spec.index_type]})"
        )
    if spec.index_type == "ivf_pq" and spec.dim % spec.pq_m:
        raise DatabaseError(
            f"lancedb: vdb.collection.pq_m {spec.pq_m} must divide the dimension {spec.dim} (ivf_pq)"
        )
    if spec.shards != 1:
        raise DatabaseError("lancedb: one embedded table per run: set vdb.collection.shards: 1")


def _forget_foreign_datasets() -> None:
    """Drop a ``datasets`` module that is not Hugging Face's from ``sys.modules``.

    LanceDB imports ``Dataset`` from any module named ``datasets`` it finds loaded, to accept Hugging Face
    datasets as input. A folder named ``datasets/`` in a directory on ``sys.path`` (the one ``python -m
    pipeline`` runs from, a user's data folder) imports as an empty namespace package under that name, and
    ``import lancedb`` itself and every LanceDB write then fail with an ImportError. A worker that embedded
    text before may have it loaded (sentence-transformers imports ``datasets`` when it can). (This
    repository's own ``datasets/`` folder cannot shadow it: Hugging Face ``datasets`` is a dependency, and
    an installed package wins over a namespace folder.)
    """
    module = sys.modules.get("datasets")
    if module is not None and not hasattr(module, "Dataset"):
        del sys.modules["datasets"]


class LanceDBClient(Client):
    """A collection as a LanceDB table at ``<data_dir>/<collection>.lance``, opened in this process."""

    visible_on_return = True  # a committed write is visible to the next query of this process

    def __init__(self, settings: LanceDBSettings, endpoints: Endpoints) -> None:
        self.settings, self.endpoints = settings, endpoints
        self.spec: CollectionSpec | None = None
        self.table: Any = None

    # -- collection -------------------------------------------------------------------------------------
    def _bound(self) -> CollectionSpec:
        if self.spec is None or self.table is None:
            raise DatabaseError("lancedb: call create_collection first (it attaches to an existing table)")
        return self.spec

    def _schema(self, spec: CollectionSpec) -> Any:
        import pyarrow as pa

        return pa.schema(
            [
                pa.field("id", pa.int64(), nullable=False),
                pa.field("vector", pa.list_(pa.float32(), spec.dim), nullable=False),
            ],
            metadata={"metric": spec.metric},
        )

    def create_collection(self, spec: CollectionSpec, *, recreate: bool = False) -> None:
        """Create (or attach to) the table; an existing one must have the same dimension and metric."""
        _forget_foreign_datasets()  # before the import: LanceDB registers its converters when imported
        import lancedb

        check_spec(spec)
        path = Path(self.endpoints.data_dir)
        path.mkdir(parents=True, exist_ok=True)
        db = lancedb.connect(str(path))
        if recreate:
            db.drop_table(spec.name, ignore_missing=True)
        if spec.name in db.list_tables().tables:
            table = db.open_table(spec.name)
            field = table.schema.field("vector")
            dim = field.type.list_size
            metric = (table.schema.metadata or {}).get(b"metric", b"?").decode()
            if dim != spec.dim or metric != spec.metric:
                raise DatabaseError(
                    f"lancedb table {spec.name!r} in {path} exists with dimension {dim} and metric {metric}, "
                    f"but dimension {spec.dim} and metric {spec.metric} were requested "
                    "(use another name or recreate it)"
                )
        else:
            table = db.create_table(spec.name, schema=self._schema(spec))
        self.table, self.spec = table, spec

    def _matrix(self, what: str, array: np.ndarray) -> np.ndarray:
        dim = self._bound().dim
        array = np.ascontiguousarray(array, dtype=np.float32)
        if array.ndim != 2 or array.shape[1] != dim:
            raise DatabaseError(f"lancedb: {what} have shape {array.shape}, collection dimension is {dim}")
        return array

    # -- writes -----------------------------------------------------------------------------------------
    def _arrow(self, ids: np.ndarray, vectors: np.ndarray) -> Any:
        import pyarrow as pa

        _forget_foreign_datasets()
        spec = self._bound()
        vectors = self._matrix("vectors", vectors)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if ids.shape != (len(vectors),):
            raise ValueError(f"lancedb: need {len(vectors)} row ids, got shape {ids.shape}")
        column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), spec.dim)
        return pa.Table.from_arrays([pa.array(ids), column], schema=self._schema(spec))

    def insert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Upsert one batch: ``merge_insert`` on ``id`` (a retry replaces, never duplicates)."""
        batch = self._arrow(ids, vectors)
        self.table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(batch)

    def insert_new(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Append rows known to be absent (the first attempt into an empty table): no join on ``id``."""
        self.table.add(self._arrow(ids, vectors))

    def wait_searchable(self, expected: int, timeout: float) -> None:
        """Committed rows are visible at once; poll the count in case another process still writes."""
        missing = "lancedb: only {seen} of {expected} rows visible after {timeout:.0f}s"
        self.wait_for_count(expected, timeout, self.settings.poll_s, missing)

    # -- index ------------------------------------------------------------------------------------------
    def _index_config(self, spec: CollectionSpec) -> Any:
        from lancedb.index import IvfFlat, IvfHnswSq, IvfPq

        s = self.settings
        common = {
            "distance_type": DISTANCE[spec.metric],
            "num_partitions": spec.ivf_nlist,
            "max_iterations": s.max_iterations,
            "sample_rate": s.sample_rate,
        }
        if spec.index_type == "ivf_pq":
            return IvfPq(**common, num_sub_vectors=spec.pq_m, num_bits=spec.pq_bits)
        if spec.index_type == "ivf_hnsw_sq":
            return IvfHnswSq(**common, m=spec.hnsw_m, ef_construction=spec.ef_construction)
        return IvfFlat(**common)

    def build_index(self, timeout: float) -> None:
        """Compact (``compact_before_index``), build the index, wait until it covers every row.

        Local index builds block in native code, so ``timeout`` bounds only the wait afterwards.
        """
        spec = self._bound()
        if self.settings.compact_before_index:
            with warnings.catch_warnings():  # "removes every version except the latest": ours alone
                warnings.simplefilter("ignore", UserWarning)
                self.table.optimize(cleanup_older_than=timedelta(0), delete_unverified=True)
        if spec.index_type == "flat":
            return
        wait = timedelta(seconds=timeout)
        self.table.create_index(
            "vector", config=self._index_config(spec), name=INDEX_NAME, replace=True, wait_timeout=wait
        )
        self.table.wait_for_index([INDEX_NAME], timeout=wait)
        stats = self.table.index_stats(INDEX_NAME)
        rows = self.count()
        if stats is None or stats.num_unindexed_rows or stats.num_indexed_rows != rows:
            raise DatabaseError(f"lancedb: index {INDEX_NAME} does not cover the {rows} rows: {stats}")

    # -- queries ----------------------------------------------------------------------------------------
    def search(self, queries: np.ndarray, k: int, ef: int | None) -> SearchResult:
        """One LanceDB query for the whole batch; ``ef`` as the module docstring says."""
        spec, s = self._bound(), self.settings
        queries = self._matrix("queries", queries)
        query = self.table.search(queries, vector_column_name="vector").distance_type(DISTANCE[spec.metric])
        query = query.select(["id", "_distance"]).limit(k)
        if spec.index_type == "flat":
            query = query.bypass_vector_index()
        elif spec.index_type == "ivf_hnsw_sq":
            query = query.nprobes(s.nprobes)
            if ef:
                query = query.ef(max(ef, k))
        else:
            query = query.nprobes(ef or s.nprobes)
        if s.refine_factor and spec.index_type != "flat":
            query = query.refine_factor(s.refine_factor)
        return _result(query.to_arrow(), len(queries), k)

    # -- facts ------------------------------------------------------------------------------------------
    def count(self) -> int:
        """Rows in the table (latest version)."""
        self._bound()
        return int(self.table.count_rows())

    def describe(self) -> StorageStats:
        """Rows, fragments (LanceDB's segments) and on-disk bytes split into data, index and metadata."""
        spec = self._bound()
        path = Path(self.endpoints.data_dir) / f"{spec.name}.lance"
        stats = self.table.stats()
        index = self.table.index_stats(INDEX_NAME) if spec.index_type != "flat" else None
        total = directory_bytes(path)
        data, indices = directory_bytes(path / "data"), directory_bytes(path / "_indices")
        return StorageStats(
            count=int(stats["num_rows"]),
            segments=int(stats["fragment_stats"]["num_fragments"]),
            disk_bytes=total,
            details={
                "data_bytes": data,
                "index_bytes": indices,
                "metadata_bytes": total - data - indices,  # manifests, transactions, deletion files
                "indexed_rows": None if index is None else index.num_indexed_rows,
                "unindexed_rows": None if index is None else index.num_unindexed_rows,
                "index_type": None if index is None else index.index_type,
                "medium": self.settings.medium,
                "data_dir": self.endpoints.data_dir,
            },
        )

    def close(self) -> None:
        """Drop the table handle (LanceDB holds no lock: another process may open the table)."""
        self.table, self.spec = None, None


def _result(table: Any, n: int, k: int) -> SearchResult:
    """Per-query top-k arrays from LanceDB's flat result (rows tagged with ``query_index``)."""
    ids = np.full((n, k), -1, dtype=np.int64)
    scores = np.full((n, k), np.nan, dtype=np.float32)
    if table.num_rows == 0:
        return SearchResult(ids=ids, scores=scores)
    found = table["id"].to_numpy()
    distance = table["_distance"].to_numpy()
    names = table.column_names
    which = table["query_index"].to_numpy() if "query_index" in names else np.zeros(len(found), np.int64)
    order = np.lexsort((distance, which))  # by query, nearest first
    which, found, distance = which[order], found[order], distance[order]
    rank = np.arange(len(which)) - np.searchsorted(which, which)  # position within its query
    keep = rank < k
    ids[which[keep], rank[keep]] = found[keep]
    scores[which[keep], rank[keep]] = distance[keep]
    return SearchResult(ids=ids, scores=scores)


def connect(settings: LanceDBSettings, endpoints: Endpoints, client_index: int = 0) -> Client:
    """The embedded client (every client index opens the same table in its own process)."""
    return LanceDBClient(settings, endpoints)
