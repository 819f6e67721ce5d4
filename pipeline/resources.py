"""The resource plan of a run: each sweep point's estimate (``apps.vdb.resources``) against what a node has.

Capacities come from the platform config (``executor.node``: memory, /dev/shm, node-local SSD, from the
sites' documentation) or, locally, from this machine (memory, free disk under the workdir). A point whose
memory per node, or data on its medium, exceeds the node's is refused at ``validate``, ``plan`` and
``run``, naming the point, the estimate and the capacity; ``vdb.resource_check: warn`` prints the same
line and goes on. Lustre and DAOS are shared file systems whose quota is not known here: not checked.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from apps.vdb import runs_in_process
from apps.vdb.resources import GIB, PointEstimate, client_memory, driver_memory, estimate, gib
from pipeline.config.loader import LoadedConfig

# The queries a query client sends when vdb.query.max_queries does not bound them: the study's order
# (22,723 BV-BRC terms, 100K Yandex-T2I queries) is 10^4 to 10^5; `plan` prints the assumption.
_ASSUMED_QUERIES = 10_000


@dataclass
class ResourcePlan:
    """Every point's estimate (None: no measured figures for its engine) and the warnings kept."""

    rows: int | None
    estimates: list[tuple[Any, PointEstimate | None]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    driver_memory: float | None = None  # bytes: the driver's peak (the DAG and the report)
    prefix_truth: bool = False  # a point loads fewer rows than the dataset: the report computes its truth
    clients_per_node: int = 1  # client processes a node runs at once (the client block's workers)


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


def clients_per_node(loaded: LoadedConfig) -> int:
    """Client processes one node runs at once: the client block's workers per node (``executor.cpu``,
    else ``executor.gpu``; a local run's ``executor.workers``)."""
    executor = loaded.config.executor
    if executor.platform == "local":
        return executor.workers
    block = getattr(executor, "cpu", None) or getattr(executor, "gpu", None)
    return int(getattr(block, "workers_per_node", None) or getattr(block, "accelerators", None) or 1)


def problems(point_estimate: PointEstimate, node: Capacity, clients: int = 1) -> list[str]:
    """What does not fit, one phrase each (``clients``: client processes per client node, HPC only)."""
    found = []
    e = point_estimate
    if node.memory is not None and e.node_memory > node.memory:
        found.append(f"about {gib(e.node_memory)} of memory per node, {node.where} has {gib(node.memory)}")
    on_client_node = clients * (e.client_memory or 0)
    if node.disk is None and node.memory is not None and on_client_node > node.memory:
        found.append(
            f"about {gib(on_client_node)} of memory per client node ({clients} client processes), "
            f"{node.where} has {gib(node.memory)}"
        )
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


def check_gpu_memory(loaded: LoadedConfig) -> None:
    """Refuse ground-truth blocks larger than one GPU's memory (``executor.node.gpu_memory_gib``): the
    exact search holds a block of ``groundtruth.memory_budget_mb`` on the device it runs on."""
    cfg = loaded.config
    node = getattr(cfg.executor, "node", None)
    limit = getattr(node, "gpu_memory_gib", None)
    budget = cfg.groundtruth.memory_budget_mb
    if cfg.groundtruth.device in ("cuda", "xpu") and limit and budget > limit * 1024:
        raise loaded.error_at(
            ("groundtruth", "memory_budget_mb"),
            f"blocks of {budget:,} MiB on the {cfg.groundtruth.device} device, one GPU of a "
            f"{cfg.executor.platform} node (executor.node.gpu_memory_gib) has {limit:g} GiB",
        )


def resource_plan(loaded: LoadedConfig, points: list[Any], rows: int | None, dim: int) -> ResourcePlan:
    """Estimate every point and check it against the node; ConfigError for the first that cannot fit
    (unless ``vdb.resource_check: warn``)."""
    cfg = loaded.config
    check_gpu_memory(loaded)
    plan = ResourcePlan(rows)
    if cfg.vdb is None or rows is None:
        return plan
    node = capacity(loaded)
    plan.clients_per_node = clients_per_node(loaded)
    plan.prefix_truth = any((p.config.insert.rows or rows) < rows for p in points)
    plan.driver_memory = driver_memory(cfg.groundtruth.memory_budget_mb if plan.prefix_truth else None)
    for point in points:
        loaded_rows = min(point.config.insert.rows or rows, rows)
        ranks, per_node, medium = _shape(cfg.vdb, point)
        found = estimate(point, loaded_rows, dim, medium, ranks, per_node)
        if found is not None and not runs_in_process(point.settings):
            query = point.config.query
            sent = query.max_queries or _ASSUMED_QUERIES
            found = replace(
                found, client_memory=client_memory(dim, cfg.dataset.row_group_rows, sent, max(query.k))
            )
        plan.estimates.append((point, found))
        if found is None:
            continue
        found_problems = problems(found, node, plan.clients_per_node)
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
