"""Cores per worker on this machine: CPU affinity for the servers a local deployment starts, and each
database's own thread setting.

The same two knobs as the HPC database block (``vdb.cluster.cores_per_worker`` and ``vdb.cluster.bind``,
where the launcher binds each rank: ``mpiexec --cpu-bind`` / ``srun --cpu-bind``), here for servers started
on this machine (``vdb.cores_per_worker``, ``vdb.bind``):

* ``cores_per_worker: n`` sets each database's thread knobs to n (GOMAXPROCS for Weaviate and Milvus,
  Qdrant's search and indexing threads; a value the user set in the database's settings wins) through
  the database's own ``with_threads`` (its declaration, :class:`apps.vdb.declaration.Database`);
* ``bind: cores`` (the default) also pins every server process to CPUs 0..n-1 of those this process may
  use (``os.sched_getaffinity``), set in the child before it executes the server, so every thread it
  starts inherits it; ``bind: none`` leaves the affinity alone (threads capped, cores not pinned).
* ``cores_per_worker: None`` (the default): neither, today's behaviour.

An in-process engine (Qdrant edge) has no server process: only its threads are set. What each server
process really got is read back afterwards (:mod:`apps.vdb.server_facts`).
"""

from __future__ import annotations

import os
from typing import Any, Literal

from apps.vdb import database
from apps.vdb.cluster.layout import core_ranges
from core.errors import ConfigError

BindMode = Literal["cores", "none"]


def local_cpus(cores_per_worker: int | None, bind: BindMode) -> list[int] | None:
    """The CPUs a local server is pinned to: the first ``cores_per_worker`` this process may use.

    None when nothing is pinned (no ``cores_per_worker``, or ``bind: none``). ConfigError naming the
    fields when more cores are asked for than this machine lets the run use.
    """
    if cores_per_worker is None:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if cores_per_worker > len(allowed):
        raise ConfigError(
            f"vdb.cores_per_worker is {cores_per_worker} but this machine lets the run use "
            f"{len(allowed)} CPU(s) ({core_ranges(allowed)}); ask for at most {len(allowed)}"
        )
    return None if bind == "none" else allowed[:cores_per_worker]


def bind_local(settings: Any, cores_per_worker: int | None, bind: BindMode) -> tuple[Any, list[int] | None]:
    """(settings with the database's thread knobs set to ``cores_per_worker``, the CPUs to pin its servers
    to or None). The settings are returned unchanged without ``cores_per_worker``."""
    cpus = local_cpus(cores_per_worker, bind)
    if cores_per_worker is None:
        return settings, None
    return database(settings.name).threads(settings, cores_per_worker), cpus
