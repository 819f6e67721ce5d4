"""The resource plan of a run: each sweep point's estimate (``apps.vdb.resources``) against what a node has.

Capacities come from the platform config (``executor.node``: memory, /dev/shm, node-local SSD, from the
sites' documentation) or, locally, from this machine (memory, free disk under the workdir). A point whose
memory per node, or data on its medium, exceeds the node's is refused at ``validate``, ``plan`` and
``run``, naming the point, the estimate and the capacity; ``vdb.resource_check: warn`` prints the same
line and goes on. Lustre and DAOS are shared file systems whose quota is not known here: not checked.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from apps.vdb import runs_in_process
from apps.vdb.resources import GIB, PointEstimate, estimate, gib
from pipeline.config.loader import LoadedConfig


@dataclass
class ResourcePlan:
    """Every point's estimate (None: no measured figures for its engine) and the warnings kept."""

    rows: int | None
    estimates: list[tuple[Any, PointEstimate | None]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Capacity:
    """What one node offers, bytes (None: unknown, not checked)."""

    memory: float | None
    shm: float | None
    ssd: float | None
    disk: float | None  # local runs: free space under the workdir
    where: str


def capacity(loaded: LoadedConfig) -> Capacity:
    """The node's capacities: the platform config's, or this machine's for a local run."""
    executor = loaded.config.executor
    node = getattr(executor, "node", None)
    if executor.platform == "local" or node is None:
        workdir = Path(loaded.config.workdir).expanduser().resolve()
        while not workdir.exists():
            workdir = workdir.parent
        return Capacity(
            psutil.virtual_memory().total, None, None, shutil.disk_usage(workdir).free, "this machine"
        )
    memory = node.memory_gib * GIB if node.memory_gib else None
    shm = node.shm_gib * GIB if node.shm_gib else (memory / 2 if memory else None)
    ssd = node.ssd_gib * GIB if node.ssd_gib is not None else None
    return Capacity(memory, shm, ssd, None, f"a {executor.platform} node (executor.node)")


def _shape(vdb: Any, point: Any) -> tuple[int, int, str]:
    """(ranks, ranks per node, medium) of a point: its cluster's, or one local rank on disk."""
    if vdb.cluster is None or runs_in_process(point.settings):
        return 1, 1, "disk"
    cluster = point.config.cluster.for_database(point.database)
    return cluster.workers, cluster.workers_per_node, cluster.storage.medium


def problems(point_estimate: PointEstimate, node: Capacity) -> list[str]:
    """What does not fit, one phrase each."""
    found = []
    e = point_estimate
    if node.memory is not None and e.node_memory > node.memory:
        found.append(f"about {gib(e.node_memory)} of memory per node, {node.where} has {gib(node.memory)}")
    limits = {
        "memory": ("/dev/shm", node.shm),
        "ssd": ("node-local SSD", node.ssd),
        "disk": ("disk", node.disk),
    }
    if e.medium in limits:
        what, limit = limits[e.medium]
        if limit is not None and e.node_disk > limit:
            has = f"has {gib(limit)}" if limit else "has none"
            found.append(f"about {gib(e.node_disk)} of data on {what} per node, {node.where} {has}")
    return found


def resource_plan(loaded: LoadedConfig, points: list[Any], rows: int | None, dim: int) -> ResourcePlan:
    """Estimate every point and check it against the node; ConfigError for the first that cannot fit
    (unless ``vdb.resource_check: warn``)."""
    cfg = loaded.config
    plan = ResourcePlan(rows)
    if cfg.vdb is None or rows is None:
        return plan
    node = capacity(loaded)
    for point in points:
        loaded_rows = min(point.config.insert.rows or rows, rows)
        ranks, per_node, medium = _shape(cfg.vdb, point)
        found = estimate(point, loaded_rows, dim, medium, ranks, per_node)
        plan.estimates.append((point, found))
        if found is None:
            continue
        found_problems = problems(found, node)
        if found_problems:
            message = (
                f"point {point.label!r} cannot fit: {'; '.join(found_problems)} ({loaded_rows:,} vectors x "
                f"{dim} over {ranks} rank(s), {found.ranks_per_node} per node, medium {medium}); load fewer "
                "rows (vdb.insert.rows), use more nodes, or set vdb.resource_check: warn to run it anyway"
            )
            if cfg.vdb.resource_check == "warn":
                plan.warnings.append(message)
                continue
            raise loaded.error_at(("vdb", *cfg.vdb.written_loc(point, ("insert", "rows"))), message)
    return plan
