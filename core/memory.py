"""The memory a process has freed, handed back to the system.

An in-process engine (FAISS, Qdrant's edge shard) frees its index when the last client of the process
closes, but glibc may keep the freed blocks resident: once a long-lived process has freed any block of up
to 32 MB, glibc's mmap threshold has risen past that size, and blocks of a few MB (an IVF index's inverted
lists, a shard's buffers) come from its heaps, which it returns only when asked. A Parsl worker that
queried a 1M x 384 FAISS IVF-flat index kept 1.5 GB of it through every later point of the sweep.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None (another C library, another system)."""
    try:
        return ctypes.CDLL(None).malloc_trim  # the symbols of the process, glibc's among them
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Return the memory this process has freed to the system (glibc's ``malloc_trim(0)``; elsewhere a
    no-op). Takes milliseconds: call it where a large structure has just been freed, not per request."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
