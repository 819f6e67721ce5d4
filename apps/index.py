"""The index stage: trigger the (deferred) index build, wait for steady state, record the storage."""

from __future__ import annotations

import time
from typing import Any

from apps.insert import open_client
from apps.vdb.base import CollectionSpec


def build_index(
    database: str, settings: dict, endpoints: dict, spec: dict, rows: int, timeout: float, _searchable: dict
) -> dict[str, Any]:
    """Build the index and wait for steady state; return index time, segments, bytes, write amplification.

    Write amplification = on-disk bytes after indexing / raw float32 bytes of the vectors.
    """
    collection = CollectionSpec.model_validate(spec)
    db_client = open_client(database, settings, endpoints)
    try:
        db_client.create_collection(collection)
        started = time.time()
        db_client.build_index(timeout)
        index_seconds = time.time() - started
        stats = db_client.describe()
    finally:
        db_client.close()
    raw_bytes = rows * collection.dim * 4
    return {
        "index_s": index_seconds,
        "count": stats.count,
        "segments": stats.segments,
        "disk_bytes": stats.disk_bytes,
        "raw_bytes": raw_bytes,
        "write_amplification": stats.disk_bytes / raw_bytes if stats.disk_bytes else None,
        "details": stats.details,
    }
