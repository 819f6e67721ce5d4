"""Parsl worker pinning on nodes whose site reserves cores for the system (Aurora: 0 and 52).

Parsl's ``block``, ``block-reverse`` and ``alternating`` strategies divide every hardware thread of the
node among the workers, reserved ones included (on Aurora a 48-worker block binds its first worker to
core 0 and its 14th to core 52). On such a node they are resolved here into an explicit ``list:`` that
leaves out the reserved cores and their hyper-threads (core ``c``'s threads are ``c + k x cores``).
"""

from __future__ import annotations

import math
from typing import Protocol

STRATEGIES = ("block", "block-reverse", "alternating")


class Node(Protocol):
    """What the pinning needs to know of a node (``executors.config.NodeShape``)."""

    sockets: int
    cores_per_socket: int
    threads_per_core: int
    reserved_cores: list[int]


def _cores(node: Node) -> int:
    return node.sockets * node.cores_per_socket


def reserved_threads(node: Node) -> set[int]:
    """The reserved cores and their hyper-threads."""
    return {c + t * _cores(node) for c in node.reserved_cores for t in range(node.threads_per_core)}


def node_threads(node: Node) -> int:
    """A node's hardware threads, every core's hyper-threads: what a block's cores_per_worker divides."""
    return _cores(node) * node.threads_per_core


def pool_size(node: Node, max_workers: int, cores_per_worker: float) -> int:
    """The workers Parsl starts on a node: ``min(max_workers, hardware threads // cores_per_worker)``."""
    return min(max_workers, math.floor(node_threads(node) / cores_per_worker))


def _usable_by_socket(node: Node) -> list[list[int]]:
    """Each socket's usable threads, whole physical cores in order, each core's hyper-threads together."""
    cores = _cores(node)
    return [
        [
            core + t * cores
            for core in range(s * node.cores_per_socket, (s + 1) * node.cores_per_socket)
            if core not in node.reserved_cores
            for t in range(node.threads_per_core)
        ]
        for s in range(node.sockets)
    ]


def _ranges(threads: list[int]) -> str:
    """``[1, 2, 105, 106]`` -> ``'1-2,105-106'`` (Parsl's list syntax)."""
    parts: list[str] = []
    ordered = sorted(threads)
    start = prev = ordered[0]
    for t in [*ordered[1:], None]:
        if t is not None and t == prev + 1:
            prev = t
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if t is not None:
            start = prev = t
    return ",".join(parts)


def skip_reserved(node: Node, strategy: str, workers: int) -> str:
    """``strategy`` for ``workers`` workers as an explicit ``list:`` that never binds a reserved core.

    ``block`` / ``block-reverse``: each worker gets an equal share of whole physical cores (with their
    hyper-threads) inside one socket, in core order (reversed for ``block-reverse``); ``alternating``:
    Parsl's alternating over the usable threads.
    """
    sockets = _usable_by_socket(node)
    usable = sorted(t for socket in sockets for t in socket)
    if workers < 1 or len(usable) < workers:
        raise ValueError(f"{workers} workers do not fit {len(usable)} usable hardware threads")
    if strategy == "alternating":
        shares = [usable[i::workers] for i in range(workers)]
    else:
        shares = []
        for size in range(len(usable) // workers, 0, -1):  # the largest share that fits socket by socket
            shares = [s[i : i + size] for s in sockets for i in range(0, len(s) - size + 1, size)]
            if len(shares) >= workers:
                break
        shares = shares[:workers]
        if strategy == "block-reverse":
            shares.reverse()
    return "list:" + ":".join(_ranges(share) for share in shares)


def parse_list(affinity: str) -> list[list[int]]:
    """The threads of each worker in a ``list:a-b,c:d...`` affinity, as Parsl reads it."""
    shares = []
    for share in affinity.split(":")[1:]:
        threads: list[int] = []
        for part in share.split(","):
            lo, _, hi = part.partition("-")
            threads += range(int(lo), int(hi or lo) + 1)
        shares.append(threads)
    return shares
