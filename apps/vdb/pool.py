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

:func:`shared_pool` keeps a pool of server clients alive in this process for the next call with the same
target (the insert stage's next batch size): a client process costs a second or more of start-up and
imports, which would otherwise be paid again, and the processes of a fresh pool would still be importing
while the first ones send. Shared pools are kept for one target at a time; they close at exit or when a
pool for another target is asked for. In-process engines are never shared: their file lock must be free for
the next task, which may run in another process.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import multiprocessing
import multiprocessing.util
import threading
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from apps.vdb.base import Client, DatabaseError
from apps.vdb.records import DatabaseTarget
from core.errors import portable

_CLIENT: Client | None = None
_TARGET: DatabaseTarget | None = None
_INDEX = 0  # this process's client number: which entry rank it connects to
_LOCK = threading.RLock()
_FINALIZING: list[bool] = []  # the exit hook is registered once per process


def connect(target: DatabaseTarget, client_index: int = 0) -> None:
    """Pool initializer: remember how to connect; the connection is made on first use.

    Connecting lazily keeps a server that is briefly down (a restart) from breaking the whole pool:
    an exception in an initializer kills the pool with a generic BrokenProcessPool, while an exception
    in a task reaches the caller as the real DatabaseError.
    """
    global _TARGET, _INDEX
    _TARGET, _INDEX = target, client_index


def client() -> Client:
    """The client of the current pool process (connected and attached to the collection).

    Thread-safe: the insert stage keeps several requests in flight from one process's client.
    """
    global _CLIENT
    with _LOCK:
        if _CLIENT is None:
            if _TARGET is None:
                raise RuntimeError("no client in this process: run inside a ClientPool")
            db_client = _TARGET.open_client(_INDEX)
            db_client.create_collection(_TARGET.collection)
            if _CLIENT is None and not _FINALIZING:
                # Close the connection when a pool process exits (multiprocessing runs Finalize
                # callbacks with an exit priority; atexit hooks do not run in its children), so no
                # channel is left half-open.
                multiprocessing.util.Finalize(None, disconnect, exitpriority=10)
                _FINALIZING.append(True)
            _CLIENT = db_client
        return _CLIENT


def reset_client(failed: Client | None = None) -> None:
    """Drop this process's connection (after a failure); the next :func:`client` call reconnects.

    ``failed``: the client a request failed on; when another thread already replaced it, nothing is done.
    """
    global _CLIENT
    with _LOCK:
        if _CLIENT is not None and (failed is None or failed is _CLIENT):
            with contextlib.suppress(Exception):
                _CLIENT.close()
            _CLIENT = None


def disconnect() -> None:
    """Close this process's client (needed for in-process engines, which lock their files)."""
    global _CLIENT
    if _CLIENT is not None:
        _CLIENT.close()
        _CLIENT = None


def attach() -> int:
    """Pool function: connect afresh and attach to the collection; return its row count.

    A fresh connection for every upload: the collection may have been recreated since the last one, and
    client libraries cache a collection's schema by name.
    """
    reset_client()
    return client().count()


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

    def warm(self) -> list[int]:
        """Start every client process, connect and attach it (before any timed work); the row counts."""
        futures = [self.submit(attach, client_index=c) for c in range(self.size)]
        return [f.result() for f in futures]

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


_SHARED: dict[tuple[str, int, int], ClientPool] = {}  # (target, size, first client) -> pool


def shared_pool(size: int, target: DatabaseTarget, first_client: int = 0) -> ClientPool:
    """A pool kept open for later calls with the same arguments (see the module docstring).

    The caller must not close it; an in-process target gets a new pool, which the caller closes. Asking
    for another target's pool closes those of every other target.
    """
    if target.endpoints.in_process:
        return ClientPool(size, target, first_client)
    name = target.model_dump_json()
    key = (name, size, first_client)
    pool = _SHARED.get(key)
    if pool is not None and any(getattr(e, "_broken", False) for e in pool.executors):
        _close(key)  # a client process died (BrokenProcessPool): start new ones
        pool = None
    if pool is None:
        for other in [k for k in _SHARED if k[0] != name]:  # an earlier database's clients
            _close(other)
        pool = _SHARED[key] = ClientPool(size, target, first_client)
    return pool


def _close(key: tuple[str, int, int]) -> None:
    with contextlib.suppress(Exception):  # a broken pool must not keep the others open
        _SHARED.pop(key).close()


def close_shared_pools() -> None:
    """Close every pool :func:`shared_pool` keeps (also run at exit)."""
    for key in list(_SHARED):
        _close(key)


atexit.register(close_shared_pools)
