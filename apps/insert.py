"""The insert stage: stream vectors from the Parquet parts into a database with parallel client processes.

Work is split into units (part file, row group), dealt round-robin to the client processes; each unit is
read and sent in batches. A failed batch is retried (ids are deterministic, so a retry never duplicates).
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
from apps.vdb import get_adapter
from apps.vdb.base import CollectionSpec, DatabaseError, Endpoints
from apps.vdb.pool import ClientPool, client, reset_client

Unit = tuple[str, int]  # (part file, row group)


def work_units(dataset_dir: str) -> list[Unit]:
    """Every (part, row group) of a dataset, in dataset order."""
    units = []
    for part in dataset_parts(Path(dataset_dir)):
        units.extend((str(part), rg) for rg in range(pq.ParquetFile(part).num_row_groups))
    return units


def open_client(database: str, settings: dict, endpoints: dict):
    """A client in this process (for the one-off steps: prepare, searchability, index, describe)."""
    adapter = get_adapter(database)
    return adapter.client(adapter.settings.model_validate(settings), Endpoints.model_validate(endpoints))


def prepare_collection(
    database: str, settings: dict, endpoints: dict, spec: dict, recreate: bool
) -> dict[str, Any]:
    """Create the collection for one upload; ``recreate`` drops the one this run's previous upload made.

    The first upload never drops anything: on a server we attached to, an existing collection with
    another dimension is a clear DatabaseError, not a silent loss of someone's data.
    """
    db_client = open_client(database, settings, endpoints)
    try:
        db_client.create_collection(CollectionSpec.model_validate(spec), recreate=recreate)
        return {"count": db_client.count()}
    finally:
        db_client.close()


def _send(ids: np.ndarray, vectors: np.ndarray, retries: int, where: str) -> int:
    """Insert one batch, retrying with back-off; returns the retries used."""
    for attempt in range(retries + 1):
        try:
            client().insert(ids, vectors)
            return attempt
        except Exception as exc:  # any transport or server error: the batch is idempotent, try again
            if attempt == retries:
                raise DatabaseError(f"{where}: insert failed after {retries} retries: {exc}") from exc
            reset_client()  # reconnect: the server may have been restarted
            time.sleep(min(30.0, 0.5 * 2**attempt))
    raise AssertionError("unreachable")


def insert_units(units: list[Unit], batch_size: int, retries: int) -> dict[str, Any]:
    """Pool function: send every row of ``units`` in batches; per-batch timings for the record."""
    client()  # connect before the clock starts: upload time begins with the first request
    first_start, rows, retried, batch_seconds = None, 0, 0, []
    for part, row_group in units:
        table = pq.ParquetFile(part).read_row_group(row_group, columns=["id", "embedding"])
        ids = table.column("id").to_numpy()
        vectors = arrow_to_vectors(table.column("embedding"))
        for start in range(0, len(ids), batch_size):
            t0 = time.time()
            first_start = first_start or t0
            where = f"{Path(part).name} row group {row_group} rows {start}..{start + batch_size}"
            retried += _send(
                ids[start : start + batch_size], vectors[start : start + batch_size], retries, where
            )
            batch_seconds.append(time.time() - t0)
            rows += len(ids[start : start + batch_size])
    return {
        "rows": rows,
        "first_start": first_start,
        "last_end": time.time(),
        "batches": len(batch_seconds),
        "retried": retried,
        "batch_seconds_mean": float(np.mean(batch_seconds)) if batch_seconds else None,
    }


def insert_partition(
    database: str,
    settings: dict,
    endpoints: dict,
    spec: dict,
    units: list[Unit],
    batch_size: int,
    clients: int,
    retries: int,
) -> dict[str, Any]:
    """Parsl task: insert ``units`` with ``clients`` client processes; return the combined record."""
    endpoints_model = Endpoints.model_validate(endpoints)
    with ClientPool(
        clients, database, settings, endpoints_model, CollectionSpec.model_validate(spec)
    ) as pool:
        futures = [
            pool.submit(insert_units, units[c :: pool.size], batch_size, retries) for c in range(pool.size)
        ]
        records = [f.result() for f in futures]
    starts = [r["first_start"] for r in records if r["first_start"]]
    return {
        "rows": sum(r["rows"] for r in records),
        "first_start": min(starts) if starts else None,
        "last_end": max(r["last_end"] for r in records),
        "batches": sum(r["batches"] for r in records),
        "retried": sum(r["retried"] for r in records),
        "clients": pool.size,
    }


def wait_searchable(
    database: str, settings: dict, endpoints: dict, spec: dict, expected: int, timeout: float, *inserts: dict
) -> dict[str, Any]:
    """After every insert task: block until ``expected`` vectors are searchable, then verify the count.

    Raises DatabaseError naming how many rows are missing; never reports success with rows missing.
    """
    db_client = open_client(database, settings, endpoints)
    try:
        db_client.create_collection(CollectionSpec.model_validate(spec))
        sent = sum(r["rows"] for r in inserts)
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
        return {"searchable_at": time.time(), "count": count}
    finally:
        db_client.close()
