"""Parallel database clients as processes (one connected client per process), for insert and query.

The studies found client-side batch conversion CPU-bound, so parallel clients are processes, not asyncio.
Each process connects once (pool initializer) and keeps its client in a module global. In-process
engines (qdrant-edge) cannot be opened by two processes at once; for them the "pool" is one thread in
the calling process.

Whatever a pool function raises reaches the caller as a picklable error (:func:`core.errors.portable`):
an exception that cannot be unpickled would otherwise break the whole pool (``BrokenProcessPool``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.util
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from apps.vdb.base import Client, DatabaseError
from apps.vdb.records import DatabaseTarget
from core.errors import portable

_CLIENT: Client | None = None
_TARGET: DatabaseTarget | None = None


def connect(target: DatabaseTarget) -> None:
    """Pool initializer: remember how to connect; the connection is made on first use.

    Connecting lazily keeps a server that is briefly down (a restart) from breaking the whole pool:
    an exception in an initializer kills the pool with a generic BrokenProcessPool, while an exception
    in a task reaches the caller as the real DatabaseError.
    """
    global _TARGET
    _TARGET = target


def client() -> Client:
    """The client of the current pool process (connected and attached to the collection)."""
    global _CLIENT
    if _CLIENT is None:
        if _TARGET is None:
            raise RuntimeError("no client in this process: run inside a ClientPool")
        db_client = _TARGET.open_client()
        db_client.create_collection(_TARGET.collection)
        _CLIENT = db_client
        # Close the connection when a pool process exits (multiprocessing runs Finalize callbacks with an
        # exit priority; atexit hooks do not run in its children), so no channel is left half-open.
        multiprocessing.util.Finalize(None, disconnect, exitpriority=10)
    return _CLIENT


def reset_client() -> None:
    """Drop this process's connection (after a failure); the next :func:`client` call reconnects."""
    global _CLIENT
    if _CLIENT is not None:
        with contextlib.suppress(Exception):
            _CLIENT.close()
        _CLIENT = None


def disconnect() -> None:
    """Close this process's client (needed for in-process engines, which lock their files)."""
    global _CLIENT
    if _CLIENT is not None:
        _CLIENT.close()
        _CLIENT = None


def call(fn, *args: Any) -> Any:
    """Run a pool function; its error leaves the process as a picklable one (DatabaseError if foreign)."""
    try:
        return fn(*args)
    except Exception as exc:
        raise portable(exc, DatabaseError) from None


class ClientPool:
    """``size`` connected clients; ``submit`` runs a function of the pool in one of them."""

    def __init__(self, size: int, target: DatabaseTarget) -> None:
        self.in_process = target.endpoints.in_process
        self.size = 1 if self.in_process else size
        args = (target,)
        self.executor: Executor
        if self.in_process:
            self.executor = ThreadPoolExecutor(max_workers=1, initializer=connect, initargs=args)
        else:
            self.executor = ProcessPoolExecutor(
                max_workers=self.size,
                mp_context=multiprocessing.get_context("spawn"),  # no fork after torch/grpc threads
                initializer=connect,
                initargs=args,
            )

    def submit(self, fn, *args: Any):
        """Run ``fn(*args)`` in a pool client (``fn`` calls :func:`client`)."""
        return self.executor.submit(call, fn, *args)

    def close(self) -> None:
        """Close clients and stop the pool."""
        try:
            if self.in_process:
                self.executor.submit(disconnect).result()
        finally:  # the engine's thread (and its file lock) goes even when disconnecting failed
            self.executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
