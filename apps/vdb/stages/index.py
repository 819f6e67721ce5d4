"""The index stage: trigger the (deferred) index build, wait for steady state, record the storage."""

from __future__ import annotations

import time

from apps.vdb.records import DatabaseTarget, IndexRecord, Searchable


def build_index(
    target: DatabaseTarget, rows: int, timeout: float, _searchable: Searchable | None
) -> IndexRecord:
    """Build the index and wait for steady state; return index time, segments, bytes, write amplification.

    Write amplification = on-disk bytes after indexing / raw float32 bytes of the vectors.
    ``_searchable`` only orders this task after the upload.
    """
    collection = target.collection
    db_client = target.open_client()
    try:
        db_client.create_collection(collection)
        started = time.time()
        db_client.build_index(timeout)
        index_seconds = time.time() - started
        stats = db_client.describe()
    finally:
        db_client.close()
    raw_bytes = rows * collection.dim * 4
    return IndexRecord(
        index_s=index_seconds,
        count=stats.count,
        segments=stats.segments,
        disk_bytes=stats.disk_bytes,
        write_amplification=stats.disk_bytes / raw_bytes if stats.disk_bytes else None,
        index_bytes=_bytes(stats.details.get("index_bytes")),
        data_bytes=_bytes(stats.details.get("data_bytes")),
    )


def _bytes(value: object) -> int | None:
    """A byte count from ``StorageStats.details`` (None when the database does not give it)."""
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
