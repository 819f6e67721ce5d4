"""The insert stage's machinery without a database server: shared client pools, the retry path, the reader.

qdrant-client's local mode in memory stands in for a server in each pool process (as in
test_client_spread.py); a recording client stands in where the requests themselves are checked.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from apps.dataset.layout import arrow_to_vectors, finalize_dataset, vectors_to_arrow
from apps.vdb import pool
from apps.vdb.base import Client, CollectionSpec, DatabaseError, Endpoint, Endpoints
from apps.vdb.qdrant.settings import QdrantSettings
from apps.vdb.records import DatabaseTarget
from apps.vdb.stages import insert
from core.store import write_parquet_atomic


def local_target(nodes: int = 1) -> DatabaseTarget:
    """A target whose clients open qdrant-client's local mode in memory (one store per process)."""
    endpoints = Endpoints(
        database="qdrant",
        nodes=[
            Endpoint(rank=r, host=f"node{r}", port=6333, extra={"location": ":memory:"}) for r in range(nodes)
        ],
        data_dir="",
    )
    settings = QdrantSettings(mode="server", url=":memory:")
    return DatabaseTarget(settings=settings, endpoints=endpoints, collection=CollectionSpec(dim=4))


def test_shared_pools_are_kept_for_the_next_upload_and_closed_for_another_target() -> None:
    target = local_target()
    try:
        first = pool.shared_pool(2, target)
        assert first.warm() == [0, 0]  # both processes connected and attached: empty collections
        pids = [first.submit(os.getpid, client_index=c).result() for c in range(2)]
        again = pool.shared_pool(2, target)
        assert again is first and again.warm() == [0, 0]
        assert [again.submit(os.getpid, client_index=c).result() for c in range(2)] == pids
        one = pool.shared_pool(1, target)  # another size for the same target: both are kept
        assert one is not first and pool.shared_pool(2, target) is first
        other = pool.shared_pool(2, local_target(nodes=2))  # another target: the first target's go
        assert other is not first and all(e._shutdown_thread for e in first.executors + one.executors)
        assert list(pool._SHARED.values()) == [other]
    finally:
        pool.close_shared_pools()
    assert not pool._SHARED


def test_in_process_targets_are_never_shared(tmp_path: Path) -> None:
    endpoints = Endpoints(database="qdrant", nodes=[], data_dir=str(tmp_path), in_process=True)
    target = DatabaseTarget(settings=QdrantSettings(), endpoints=endpoints, collection=CollectionSpec(dim=4))
    one = pool.shared_pool(2, target)
    try:
        assert one.size == 1 and pool.shared_pool(2, target) is not one and not pool._SHARED
    finally:
        one.close()


def test_reset_client_leaves_a_client_another_thread_made_alone() -> None:
    pool.connect(local_target())
    try:
        first = pool.client()
        pool.reset_client(object())  # a request failed on an older client: this one stays
        assert pool.client() is first
        pool.reset_client(first)
        assert pool.client() is not first
    finally:
        pool.disconnect()
        pool.connect(None)  # type: ignore[arg-type]  # no pool target left in this process


class Recording(Client):
    """Records every request; the first attempt of the batch starting at ``fail_at`` fails once."""

    insert_concurrency = 2
    calls: ClassVar[list[tuple[str, int, int]]] = []
    fail_at: ClassVar[int | None] = None
    lock = threading.Lock()

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def _record(self, how: str, ids: np.ndarray, vectors: np.ndarray) -> None:
        assert vectors.dtype == np.float32 and vectors.shape == (len(ids), 4)
        with self.lock:
            self.calls.append((how, int(ids[0]), len(ids)))
            if how == "new" and int(ids[0]) == Recording.fail_at:
                Recording.fail_at = None
                raise DatabaseError("connection reset")

    def insert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self._record("upsert", ids, vectors)

    def insert_new(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self._record("new", ids, vectors)

    def create_collection(self, spec: CollectionSpec, *, recreate: bool = False) -> None:
        pass

    def count(self) -> int:
        return 0

    wait_searchable = build_index = search = describe = None  # type: ignore[assignment]


def dataset(tmp_path: Path, dtype: str = "float32") -> Path:
    """100 vectors of dimension 4 in two parts, row groups of 30 (8 work units)."""
    records = []
    for shard in range(2):
        ids = np.arange(shard * 50, shard * 50 + 50, dtype=np.int64)
        vectors = np.random.default_rng(shard).random((50, 4), dtype=np.float32)
        table = pa.table({"id": ids, "embedding": vectors_to_arrow(vectors, dtype)})
        name = f"part-{shard:05d}.parquet"
        written = write_parquet_atomic(table, tmp_path / name, row_group_rows=30)
        records.append({"file": name, "shard": shard, **written})
    finalize_dataset(str(tmp_path), "tiny", records, {"dimension": 4}, {})
    return tmp_path


def test_first_attempts_into_an_empty_collection_are_plain_inserts_and_retries_upserts(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(DatabaseTarget, "open_client", lambda self, client_index=0: Recording())
    monkeypatch.setattr(insert.time, "sleep", lambda s: None)  # no back-off wait in a test
    Recording.calls.clear()
    Recording.fail_at = 20
    pool.connect(local_target())
    try:
        units = insert.work_units(str(dataset(tmp_path)))
        part = insert.insert_units(units, 10, retries=1, fresh=True)
        again = insert.insert_units(units[:1], 10, retries=1, fresh=False)
    finally:
        pool.disconnect()
        pool.connect(None)  # type: ignore[arg-type]
    assert (part.rows, part.batches, part.retried, part.visible_at) == (100, 10, 1, None)
    first, second = Recording.calls[:11], Recording.calls[11:]
    # every batch went out once as a plain insert; the one that failed was retried as an upsert
    assert sorted((lo, n) for how, lo, n in first if how == "new") == [(lo, 10) for lo in range(0, 100, 10)]
    assert [c for c in first if c[0] == "upsert"] == [("upsert", 20, 10)]
    # into a collection that was not empty: upserts only
    assert sorted(second) == [("upsert", 0, 10), ("upsert", 10, 10), ("upsert", 20, 10)]
    assert again.rows == 30


def test_read_unit_equals_arrow_to_vectors(tmp_path: Path) -> None:
    for dtype in ("float32", "float16"):  # float16: converted (a copy), float32: a view of the buffer
        directory = dataset(tmp_path / dtype, dtype)
        part = str(directory / "part-00001.parquet")
        ids, vectors = insert.read_unit(part, 1)
        table = pq.ParquetFile(part).read_row_group(1)
        assert ids.tolist() == list(range(80, 100)) and vectors.dtype == np.float32
        np.testing.assert_array_equal(vectors, arrow_to_vectors(table.column("embedding")))
