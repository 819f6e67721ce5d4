"""The insert stage: stream vectors from the Parquet parts into a database with parallel client processes.

Work is split into units (part file, row group), dealt round-robin to the client processes; each unit is
read and sent in batches of the configured size (a batch above the client's maximum request size goes out
as several requests, recorded as such). A failed request is retried (ids are deterministic, so a retry
never duplicates).
Upload time runs from the first request to the moment every vector is visible to search; the stage fails
and says how many rows are missing if the final count differs from the rows written.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from apps.dataset import arrow_to_vectors, dataset_parts
from apps.vdb.base import DatabaseError
from apps.vdb.pool import ClientPool, client, reset_client
from apps.vdb.records import DatabaseTarget, InsertPart, Searchable

Unit = tuple[str, int]  # (part file, row group)


def work_units(dataset_dir: str) -> list[Unit]:
    """Every (part, row group) of a dataset, in dataset order."""
    units = []
    for part in dataset_parts(Path(dataset_dir)):
        units.extend((str(part), rg) for rg in range(pq.ParquetFile(part).num_row_groups))
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


def _send(ids: np.ndarray, vectors: np.ndarray, retries: int, where: str) -> int:
    """Insert one request, retrying with back-off; returns the retries used."""
    for attempt in range(retries + 1):
        try:
            client().insert(ids, vectors)
            return attempt
        except Exception as exc:  # any transport or server error: the request is idempotent, try again
            if attempt == retries:
                raise DatabaseError(f"{where}: insert failed after {retries} retries: {exc}") from exc
            reset_client()  # reconnect: the server may have been restarted
            time.sleep(min(30.0, 0.5 * 2**attempt))
    raise AssertionError("unreachable")


def request_size(batch_size: int, db_client: Any) -> int:
    """Vectors per request: the configured batch, or the client's maximum request size when smaller."""
    limit = getattr(db_client, "max_request_size", None)  # None: the database takes any size
    return batch_size if limit is None else max(1, min(batch_size, int(limit)))


def insert_units(units: list[Unit], batch_size: int, retries: int) -> InsertPart:
    """Pool function: send every row of ``units`` in batches of ``batch_size``.

    A batch larger than the client's ``max_request_size`` goes out as consecutive requests of at most that
    size, so the configured batch size is what is sent and the record says how large each request was.
    """
    size = request_size(batch_size, client())  # connect before the clock: upload time begins with a request
    first_start, rows, retried, batches = None, 0, 0, 0
    for part, row_group in units:
        table = pq.ParquetFile(part).read_row_group(row_group, columns=["id", "embedding"])
        ids = table.column("id").to_numpy()
        vectors = arrow_to_vectors(table.column("embedding"))
        for start in range(0, len(ids), batch_size):
            first_start = first_start or time.time()
            stop = min(start + batch_size, len(ids))
            for lo in range(start, stop, size):
                hi = min(lo + size, stop)
                where = f"{Path(part).name} row group {row_group} rows {lo}..{hi}"
                retried += _send(ids[lo:hi], vectors[lo:hi], retries, where)
            batches += 1
            rows += stop - start
    return InsertPart(
        rows=rows,
        first_start=first_start,
        last_end=time.time(),
        batches=batches,
        retried=retried,
        clients=1,
        request_size=size,
    )


def combine_parts(parts: list[InsertPart]) -> InsertPart:
    """The record of several clients (or tasks) of one upload."""
    starts = [p.first_start for p in parts if p.first_start]
    return InsertPart(
        rows=sum(p.rows for p in parts),
        first_start=min(starts) if starts else None,
        last_end=max(p.last_end for p in parts),
        batches=sum(p.batches for p in parts),
        retried=sum(p.retried for p in parts),
        clients=sum(p.clients for p in parts),
        request_size=max(p.request_size for p in parts),
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
    """
    with ClientPool(clients, target, first_client=worker * clients) as pool:
        futures = [
            pool.submit(insert_units, units[c :: pool.size], batch_size, retries, client_index=c)
            for c in range(pool.size)
        ]
        return combine_parts([f.result() for f in futures])


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
