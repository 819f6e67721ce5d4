"""The insert stage: stream vectors from the Parquet parts into a database with parallel client processes.

Work is split into units (part file, row group), dealt round-robin to the client processes; each unit is
read and sent in batches of the configured size (a batch above the client's maximum request size goes out
as several requests, recorded as such). A failed request is retried (ids are deterministic, so a retry
never duplicates).
Upload time runs from the first request to the moment every vector is visible to search; the stage fails
and says how many rows are missing if the final count differs from the rows written. Client processes
start before the first request and serve the next upload too (``shared_pool``); where the time of an
upload went was measured with ``python -m benchmarks.ingest --profile``.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from apps.dataset.layout import arrow_to_vectors, dataset_parts
from apps.vdb.base import DatabaseError
from apps.vdb.pool import client, reset_client, shared_pool
from apps.vdb.records import DatabaseTarget, InsertPart, Searchable
from core.store import naming_damage, read_store_row_group

# (part file, row group) or (part file, row group, rows of it to load): the last unit of a prefix
Unit = tuple[str, int] | tuple[str, int, int]


def work_units(dataset_dir: str, rows: int | None = None) -> list[Unit]:
    """Every (part, row group) of a dataset, in dataset order; with ``rows``, only the first ``rows`` rows
    (``vdb.insert.rows``): the units holding them, the last one clipped to ``(part, row group, stop)``.

    Raises ValueError naming ``vdb.insert.rows`` when the dataset holds fewer rows.
    """
    units: list[Unit] = []
    position = 0
    for part in dataset_parts(Path(dataset_dir)):
        with naming_damage(part):
            metadata = pq.ParquetFile(part).metadata
        for rg in range(metadata.num_row_groups):
            if rows is not None and position >= rows:
                return units
            size = metadata.row_group(rg).num_rows
            if rows is not None and position + size > rows:
                units.append((str(part), rg, rows - position))
            else:
                units.append((str(part), rg))
            position += size
    if rows is not None and position < rows:
        raise ValueError(f"vdb.insert.rows = {rows} exceeds the dataset's {position} rows ({dataset_dir})")
    return units


def prepare_collection(target: DatabaseTarget, recreate: bool) -> None:
    """Create the collection for one upload; ``recreate`` drops the one this run's previous upload made.

    The first upload never drops anything: on a server we attached to, an existing collection with
    another dimension is a clear DatabaseError, not a silent loss of someone's data.
    """
    db_client = target.open_client()
    try:
        db_client.create_collection(target.collection, recreate=recreate)
    finally:
        db_client.close()


def _send(ids: np.ndarray, vectors: np.ndarray, retries: int, where: str, fresh: bool) -> int:
    """Insert one request, retrying with back-off; returns the retries used.

    ``fresh``: the rows are known absent (an empty collection at the start of the upload), so the first
    attempt may use the client's cheaper ``insert_new``; a retry always upserts (the failed attempt may
    have landed).
    """
    for attempt in range(retries + 1):
        db_client = client()
        try:
            if fresh and attempt == 0:
                db_client.insert_new(ids, vectors)
            else:
                db_client.insert(ids, vectors)
            return attempt
        except Exception as exc:  # any transport or server error: the request is idempotent, try again
            if attempt == retries:
                raise DatabaseError(f"{where}: insert failed after {retries} retries: {exc}") from exc
            reset_client(db_client)  # reconnect: the server may have been restarted
            time.sleep(min(30.0, 0.5 * 2**attempt))
    raise AssertionError("unreachable")


def request_size(batch_size: int, db_client: Any) -> int:
    """Vectors per request: the configured batch, or the client's maximum request size when smaller."""
    limit = getattr(db_client, "max_request_size", None)  # None: the database takes any size
    return batch_size if limit is None else max(1, min(batch_size, int(limit)))


def read_unit(part: str, row_group: int, stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, float32 vectors) of one work unit (its first ``stop`` rows when given); the vectors a
    read-only view of the Arrow buffer when they are float32 without nulls (a copy costs as much as a
    third of the read)."""
    table = read_store_row_group(part, row_group, ["id", "embedding"])
    if stop is not None:
        table = table.slice(0, stop)
    column = table.column("embedding").combine_chunks()
    ids = table.column("id").to_numpy()
    if column.null_count == 0 and column.values.null_count == 0 and column.type.value_type == pa.float32():
        flat = column.values.to_numpy(zero_copy_only=True)[column.offset * column.type.list_size :]
        return ids, flat[: len(column) * column.type.list_size].reshape(len(column), column.type.list_size)
    return ids, arrow_to_vectors(column)


def insert_units(
    units: list[Unit], batch_size: int, retries: int, fresh: bool = False, clients: int = 1
) -> InsertPart:
    """Pool function: send every row of ``units`` in batches of ``batch_size``.

    A batch larger than the client's ``max_request_size`` goes out as consecutive requests of at most that
    size, so the configured batch size is what is sent and the record says how large each request was.
    The next unit is read in a thread while this one is sent (Parquet reads release the GIL), and the
    client's ``insert_concurrency`` requests are in flight across the task's ``clients`` processes (at
    least one each), so building one request overlaps with the server's work on the previous one (as the
    vendors' own batchers do) without piling more concurrent requests on the server than that. A client
    whose inserts are visible on return (``visible_on_return``: an in-process engine) counts after the
    last request and records that moment as ``visible_at``.
    """
    db_client = client()  # connected before the clock: upload time begins with a request
    size = request_size(batch_size, db_client)
    in_flight = max(1, -(-int(getattr(db_client, "insert_concurrency", 1)) // max(1, clients)))
    first_start, rows, retried, batches = None, 0, 0, 0
    pending: deque[Future] = deque()
    with ThreadPoolExecutor(1) as reader, ThreadPoolExecutor(in_flight) as senders:
        ahead = reader.submit(read_unit, *units[0]) if units else None
        for n, (part, row_group, *_) in enumerate(units):
            ids, vectors = ahead.result()
            if n + 1 < len(units):
                ahead = reader.submit(read_unit, *units[n + 1])
            for start in range(0, len(ids), batch_size):
                first_start = first_start or time.time()
                stop = min(start + batch_size, len(ids))
                for lo in range(start, stop, size):
                    hi = min(lo + size, stop)
                    where = f"{Path(part).name} row group {row_group} rows {lo}..{hi}"
                    args = (ids[lo:hi], vectors[lo:hi], retries, where, fresh)
                    if in_flight == 1:
                        retried += _send(*args)
                        continue
                    while len(pending) >= in_flight:
                        retried += pending.popleft().result()
                    pending.append(senders.submit(_send, *args))
                batches += 1
                rows += stop - start
        while pending:
            retried += pending.popleft().result()
    last_end, visible_at = time.time(), None
    if getattr(db_client, "visible_on_return", False):
        client().count()  # what the engine's own bulk path would ask before calling its rows searchable
        visible_at = time.time()
    return InsertPart(
        rows=rows,
        first_start=first_start,
        last_end=last_end,
        batches=batches,
        retried=retried,
        clients=1,
        request_size=size,
        visible_at=visible_at,
    )


def combine_parts(parts: list[InsertPart]) -> InsertPart:
    """The record of several clients (or tasks) of one upload."""
    starts = [p.first_start for p in parts if p.first_start]
    visible = [p.visible_at for p in parts]
    return InsertPart(
        rows=sum(p.rows for p in parts),
        first_start=min(starts) if starts else None,
        last_end=max(p.last_end for p in parts),
        batches=sum(p.batches for p in parts),
        retried=sum(p.retried for p in parts),
        clients=sum(p.clients for p in parts),
        request_size=max(p.request_size for p in parts),
        visible_at=max(visible) if parts and None not in visible else None,
    )


def insert_partition(
    target: DatabaseTarget,
    units: list[Unit],
    batch_size: int,
    clients: int,
    retries: int,
    worker: int = 0,
) -> InsertPart:
    """Parsl task: insert ``units`` with ``clients`` client processes; return the combined record.

    ``worker`` is this task's index among the stage's insert tasks: its clients are numbered from
    ``worker x clients``, so the stage's clients are spread round-robin over the database's entry ranks.
    The client processes are started, connected and attached before the first request, and kept for the
    next upload of this task's process (:func:`apps.vdb.pool.shared_pool`). When the collection is empty
    at that point, the first attempt of every request is a plain insert (``Client.insert_new``).
    """
    pool = shared_pool(clients, target, first_client=worker * clients)
    try:
        fresh = not any(pool.warm())
        futures = [
            pool.submit(
                insert_units, units[c :: pool.size], batch_size, retries, fresh, pool.size, client_index=c
            )
            for c in range(pool.size)
        ]
        return combine_parts([f.result() for f in futures])
    finally:
        if pool.in_process:  # its lock must be free for the next task (see shared_pool)
            pool.close()


def wait_searchable(
    target: DatabaseTarget, expected: int, timeout: float, *inserts: InsertPart
) -> Searchable:
    """After every insert task: block until ``expected`` vectors are searchable, then verify the count.

    Raises DatabaseError naming how many rows are missing; never reports success with rows missing.
    """
    database = target.database
    db_client = target.open_client()
    try:
        db_client.create_collection(target.collection)
        sent = sum(r.rows for r in inserts)
        if sent != expected:
            raise DatabaseError(f"{database}: clients sent {sent} rows but the dataset has {expected}")
        if inserts and all(r.visible_at is not None for r in inserts):
            # Inserts visible on return (an in-process engine): searchable when the last part saw its
            # rows counted, provided the count now is the dataset's.
            count = db_client.count()
            if count != expected:
                raise DatabaseError(f"{database}: {expected - count} of {expected} rows missing after upload")
            return Searchable(searchable_at=max(r.visible_at for r in inserts), count=count)
        try:
            db_client.wait_searchable(expected, timeout)
        except Exception as exc:
            count = db_client.count()
            raise DatabaseError(
                f"{database}: {expected - count} of {expected} rows missing after upload ({exc})"
            ) from exc
        count = db_client.count()
        if count != expected:
            raise DatabaseError(f"{database}: {expected - count} of {expected} rows missing after upload")
        return Searchable(searchable_at=time.time(), count=count)
    finally:
        db_client.close()
