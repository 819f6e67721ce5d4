"""Parallel database clients as processes (one connected client per process), for insert and query.

The studies found client-side batch conversion CPU-bound, so parallel clients are processes, not asyncio.
Each process connects once (pool initializer) and keeps its client in a module global. In-process
engines (qdrant-edge) cannot be opened by two processes at once; for them the "pool" is one thread in
the calling process.

Client ``c`` of a pool is one process of its own, numbered ``first_client + c`` across the stage (an insert
task passes ``worker index x clients per worker``); it connects to ``Endpoints.entry`` of that number, so
clients are spread round-robin over the database's entry ranks, and ``submit`` deals tasks to the
clients in turn, so the i-th task of a round always runs in client i.

Whatever a pool function raises reaches the caller as a picklable error (:func:`core.errors.portable`):
an exception that cannot be unpickled would otherwise break the whole pool (``BrokenProcessPool``).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import multiprocessing.util
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from apps.vdb.base import Client, DatabaseError
from apps.vdb.records import DatabaseTarget
from core.errors import portable

_CLIENT: Client | None = None
_TARGET: DatabaseTarget | None = None
_INDEX = 0  # this process's client number: which entry rank it connects to


def connect(target: DatabaseTarget, client_index: int = 0) -> None:
    """Pool initializer: remember how to connect; the connection is made on first use.

    Connecting lazily keeps a server that is briefly down (a restart) from breaking the whole pool:
    an exception in an initializer kills the pool with a generic BrokenProcessPool, while an exception
    in a task reaches the caller as the real DatabaseError.
    """
    global _TARGET, _INDEX
    _TARGET, _INDEX = target, client_index


def client() -> Client:
    """The client of the current pool process (connected and attached to the collection)."""
    global _CLIENT
    if _CLIENT is None:
        if _TARGET is None:
            raise RuntimeError("no client in this process: run inside a ClientPool")
        db_client = _TARGET.open_client(_INDEX)
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
    """``size`` connected clients, one process each; ``submit`` runs a pool function in the next client."""

    def __init__(self, size: int, target: DatabaseTarget, first_client: int = 0) -> None:
        self.in_process = target.endpoints.in_process
        self.size = 1 if self.in_process else size
        self.first_client = first_client
        self.executors: list[Executor]
        if self.in_process:
            self.executors = [
                ThreadPoolExecutor(max_workers=1, initializer=connect, initargs=(target, first_client))
            ]
        else:
            spawn = multiprocessing.get_context("spawn")  # no fork after torch/grpc threads
            self.executors = [
                ProcessPoolExecutor(
                    max_workers=1, mp_context=spawn, initializer=connect, initargs=(target, first_client + c)
                )
                for c in range(self.size)
            ]
        self._turn = itertools.count()

    def submit(self, fn, *args: Any, client_index: int | None = None):
        """Run ``fn(*args)`` in client ``client_index`` of this pool, else in the next client in turn.

        ``fn`` calls :func:`client`.
        """
        c = next(self._turn) if client_index is None else client_index
        return self.executors[c % self.size].submit(call, fn, *args)

    def close(self) -> None:
        """Close clients and stop the pool."""
        try:
            if self.in_process:
                self.executors[0].submit(disconnect).result()
        finally:  # the engine's thread (and its file lock) goes even when disconnecting failed
            for executor in self.executors:
                executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
