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

from apps.vdb import database, runs_in_process
from apps.vdb.binding import local_cpus
from apps.vdb.resources import GIB, PointEstimate, client_memory, driver_memory, estimate
from core.errors import ConfigError
from core.format import duration, size
from executors.allocation import in_one_allocation, job_walltime
from executors.config import MIN_DRAIN_PERIOD_S, drain_period, walltime_seconds
from pipeline.config.loader import LoadedConfig
from pipeline.sweep import load_s, query_cost

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
    queries: int | None = None  # the dataset's queries, when known
    queries_assumed: bool = False  # some point's query count was assumed (_ASSUMED_QUERIES)


@dataclass(frozen=True)
class Capacity:
    """What one node offers, bytes (None: unknown, not checked)."""

    memory: float | None
    shm: float | None
    ssd: float | None
    disk: float | None  # local runs: free space under the workdir
    where: str
    clients_apart: bool = False  # HPC: the clients run on their own nodes (the client block's)


def disk_usage(path: Path) -> Any:
    """``shutil.disk_usage`` of the file system that holds ``path``, or will once it is made."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path)


def capacity(loaded: LoadedConfig) -> Capacity:
    """The node's capacities: the platform config's, or this machine's for a local run."""
    executor = loaded.config.executor
    node = getattr(executor, "node", None)
    if executor.platform == "local" or node is None:
        workdir = loaded.config.workdir_path
        return Capacity(psutil.virtual_memory().total, None, None, disk_usage(workdir).free, "this machine")
    memory = node.memory_gib * GIB if node.memory_gib else None
    shm = node.shm_gib * GIB if node.shm_gib else (memory / 2 if memory else None)
    ssd = node.ssd_gib * GIB if node.ssd_gib is not None else None
    return Capacity(memory, shm, ssd, None, f"a {executor.platform} node (executor.node)", clients_apart=True)


def _shape(vdb: Any, point: Any) -> tuple[int, int, str, int | None]:
    """(ranks, ranks per node, medium, cores per rank) of a point: its cluster's, or its local ranks (one,
    or a local cluster's processes) on disk with this machine's cores."""
    if runs_in_process(point.settings):
        return 1, 1, "disk", None
    if vdb.cluster is None:
        count = database(point.database).local_ranks
        ranks = count(point.settings) if count is not None else 1
        return ranks, ranks, "disk", None
    cluster = point.config.cluster.for_database(point.database)
    return cluster.workers, cluster.workers_per_node, cluster.storage.medium, cluster.cores_per_worker


def workers_per_node(loaded: LoadedConfig) -> int:
    """Tasks one client node runs at once: the client block's workers per node (``executor.cpu``, else
    ``executor.gpu``; a local run's ``executor.workers``)."""
    executor = loaded.config.executor
    if executor.platform == "local":
        return executor.workers
    block = getattr(executor, "cpu", None) or getattr(executor, "gpu", None)
    return int(getattr(block, "workers_per_node", None) or getattr(block, "accelerators", None) or 1)


def client_processes(point: Any, workers: int) -> int:
    """Client processes of ``point`` on one client node: an insert task starts ``clients_per_worker``
    of them (apps/vdb/pool.py) on each of at most ``workers`` workers, a query setting ``clients``."""
    insert = point.config.insert
    return max(min(insert.workers, workers) * insert.clients_per_worker, max(point.config.query.clients))


def queries_sent(point: Any, queries: int | None) -> tuple[int, bool]:
    """(queries a query client holds, whether the count was assumed): ``vdb.query.max_queries`` or the
    dataset's queries, whichever is smaller."""
    bound = point.config.query.max_queries
    known = [n for n in (bound, queries) if n]
    return (min(known), False) if known else (_ASSUMED_QUERIES, True)


def problems(point_estimate: PointEstimate, node: Capacity) -> list[str]:
    """What of the database's share does not fit a node, one phrase each."""
    found = []
    e = point_estimate
    if node.memory is not None and e.node_memory > node.memory:
        found.append(f"about {size(e.node_memory)} of memory per node, {node.where} has {size(node.memory)}")
    limits = {
        "memory": ("/dev/shm", node.shm),
        "ssd": ("node-local SSD", node.ssd),
        "disk": ("disk", node.disk),
    }
    if e.medium in limits:
        what, limit = limits[e.medium]
        if limit is not None and e.node_disk > limit:
            has = f"has {size(limit)}" if limit else "has none"
            found.append(f"about {size(e.node_disk)} of data on {what} per node, {node.where} {has}")
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


def check_local_device(loaded: LoadedConfig) -> None:
    """Refuse ``groundtruth.device: cuda`` (or ``xpu``) on a local run whose machine has none: the stage
    would fail only after the dataset is built. HPC workers are checked where they run."""
    cfg = loaded.config
    device = cfg.groundtruth.device
    if cfg.executor.platform != "local" or device not in ("cuda", "xpu"):
        return
    from apps.dataset.device import accelerator_available  # torch: only for a device named outright

    if not accelerator_available(device):
        raise loaded.error_at(
            ("groundtruth", "device"), f"{device}: this machine has no {device} device; use auto or cpu"
        )


def check_local_cores(loaded: LoadedConfig, points: list[Any]) -> None:
    """Refuse, at the field's line, a local point asking more cores (``vdb.cores_per_worker``) than this
    machine lets the run use: its servers would be refused only when the point deploys, after the dataset."""
    if loaded.config.vdb is None or loaded.config.executor.platform != "local":
        return
    for point in points:
        try:
            local_cpus(point.config.cores_per_worker, point.config.bind)
        except ConfigError as exc:
            where = loaded.config.vdb.written_loc(point, ("cores_per_worker",))
            raise loaded.error_at(("vdb", *where), f"point {point.label!r}: {exc}") from None


def resource_plan(
    loaded: LoadedConfig,
    points: list[Any],
    rows: int | None,
    dim: int,
    queries: int | None = None,
    *,
    pending: list[Any] | None = None,
    truth_done: bool = False,
) -> ResourcePlan:
    """Estimate every point and check it against the node; ConfigError for the first that cannot fit
    (unless ``vdb.resource_check: warn``). ``queries``: the dataset's query count, when known.

    This machine's device and cores are checked only for what is still to run (``pending`` points, the
    ground truth unless ``truth_done``): results made elsewhere are reused on any machine.
    """
    cfg = loaded.config
    check_gpu_memory(loaded)
    if not truth_done:
        check_local_device(loaded)
    to_run = points if pending is None else pending  # done points do not run
    check_local_cores(loaded, to_run)
    plan = ResourcePlan(rows)
    plan.warnings += _drain_beyond_walltimes(loaded)
    for point in to_run:  # needs no row count
        plan.warnings += _beyond_walltimes(loaded, point)
    if cfg.vdb is None or rows is None:
        plan.warnings += _beyond_allocation(loaded, to_run, {})
        return plan
    node = capacity(loaded)
    workers = workers_per_node(loaded)
    plan.queries = queries
    plan.prefix_truth = any((p.config.insert.rows or rows) < rows for p in points)
    # Base vectors the report fetches in its one pass: the exact top-k, and the returned ids outside it.
    # Taken as 2 x queries x k: most returned ids are exact neighbours (recall near 1 at every point); a
    # sweep of many low-recall points fetches more.
    deepest = 0
    for point in points:
        loaded_rows = min(point.config.insert.rows or rows, rows)
        ranks, per_node, medium, cores = _shape(cfg.vdb, point)
        found = estimate(point, loaded_rows, dim, medium, ranks, per_node, cores)
        if found is not None and cfg.vdb.cluster is None and ranks > 1:  # a local cluster's processes
            alone = estimate(point, loaded_rows, dim, medium, 1, 1, cores)  # share this machine's cores:
            found = replace(found, upload_s=alone.upload_s, index_s=alone.index_s)  # no faster than one
        sent, assumed = queries_sent(point, queries)
        plan.queries_assumed |= assumed
        deepest = max(deepest, min(rows, 2 * sent * max(point.config.query.k)))
        if found is not None and not runs_in_process(point.settings):
            query = point.config.query
            each = client_memory(dim, cfg.dataset.row_group_rows, sent, max(query.k))
            found = replace(found, client_memory=each, client_processes=client_processes(point, workers))
        plan.estimates.append((point, found))
        if found is None:
            continue
        # Blamed on vdb.insert.rows where the point sets it; else on its database entry (the rows are the
        # dataset's: its manifest's count, or dataset.expected_rows before it is made).
        rows_field = ("insert", "rows") if point.config.insert.rows is not None else ("databases", 0)
        _check(loaded, plan, point, problems(found, node), rows_field, (
            f"({loaded_rows:,} vectors x {dim} over {ranks} rank(s), {found.ranks_per_node} per node, medium "
            f"{medium}); load fewer rows (vdb.insert.rows), use more nodes"
        ))  # fmt: skip
        on_client_node = (found.client_processes or 0) * (found.client_memory or 0)
        # On HPC the clients have their own nodes; a local run's share this machine with the database.
        beside = 0.0 if node.clients_apart else found.node_memory
        if node.memory is not None and on_client_node and beside + on_client_node > node.memory:
            each = f"about {size(found.client_memory)} each: a row group, or {sent:,} queries"
            place = f"beside the database's {size(beside)}" if beside else "on one client node"
            by_queries = max(point.config.query.clients) == found.client_processes
            _check(loaded, plan, point, [
                f"about {size(on_client_node)} of memory for its {found.client_processes} client processes "
                f"({each}) {place}, {node.where} has {size(node.memory)}"
            ], ("query", "clients") if by_queries else ("insert", "clients_per_worker"), (
                "(lower vdb.insert.clients_per_worker, vdb.query.clients or vdb.query.max_queries, or the "
                "client block's workers_per_node)"
            ))  # fmt: skip
        plan.warnings += _beyond_timeouts(point, found)
    plan.warnings += _beyond_allocation(loaded, to_run, {id(p): e for p, e in plan.estimates})
    plan.driver_memory = driver_memory(
        cfg.groundtruth.memory_budget_mb if plan.prefix_truth else None, deepest * 4 * dim
    )
    return plan


def _check(
    loaded: LoadedConfig, plan: ResourcePlan, point: Any, found: list[str], field: tuple, fix: str
) -> None:
    """Refuse (or, with ``vdb.resource_check: warn``, record) what does not fit, at ``field``'s line."""
    if not found:
        return
    vdb = loaded.config.vdb
    message = f"point {point.label!r} cannot fit: {'; '.join(found)} {fix}"
    if vdb.resource_check == "warn":
        plan.warnings.append(f"{message}; running it anyway (vdb.resource_check: warn)")
        return
    raise loaded.error_at(
        ("vdb", *vdb.written_loc(point, field)),
        f"{message}, or set vdb.resource_check: warn to run it anyway",
    )


def _beyond_timeouts(point: Any, found: PointEstimate) -> list[str]:
    """Warnings for a point whose estimated upload or index time exceeds its timeout (the estimates are
    lower bounds: such a stage is stopped before it ends)."""
    config = point.config
    late = []
    if found.upload_s > config.insert.timeout_s:
        late.append(
            f"its upload (about {duration(found.upload_s)}) exceeds vdb.insert.timeout_s "
            f"({duration(config.insert.timeout_s)})"
        )
    if found.index_s is not None and found.index_s > config.index_timeout_s:
        late.append(
            f"its index build (about {duration(found.index_s)}) exceeds vdb.index_timeout_s "
            f"({duration(config.index_timeout_s)})"
        )
    if not late:
        return []
    return [
        f"point {point.label!r}: {' and '.join(late)} by the resource plan: raise the timeout, or the "
        "stage is stopped before it ends"
    ]


def _beyond_walltimes(loaded: LoadedConfig, point: Any) -> list[str]:
    """A warning for a point whose query windows alone outlast a batch job it runs in (none off a batch
    platform): its query sweep is one task of the client block, inside its database job (a pilot). Its
    upload and index times are checked against their timeouts (:func:`_beyond_timeouts`)."""
    executor = loaded.config.executor
    default = getattr(executor, "walltime", None)
    if default is None or in_one_allocation(executor):  # one job: _beyond_allocation times them together
        return []
    config = point.config
    settings, windows = query_cost(point)
    if not windows:
        return []
    jobs = {"its client block": job_walltime(executor, executor.cpu or executor.gpu)}
    if config.cluster is not None and not runs_in_process(point.settings):
        jobs["its database job"] = job_walltime(executor, config.cluster)
    shortest, walltime = min(jobs.items(), key=lambda job: walltime_seconds(job[1]))
    if windows <= walltime_seconds(walltime):
        return []
    return [
        f"point {point.label!r}: its {settings:,} query settings take at least {duration(windows)} "
        f"of measured windows, more than {shortest}'s walltime ({walltime}): sweep fewer settings (or "
        "shorter vdb.query.duration_s), or the job ends before the point does"
    ]


def _drain_beyond_walltimes(loaded: LoadedConfig) -> list[str]:
    """A warning for each batch job whose walltime ``executor.drain_margin_s`` leaves less than a minute
    of (:func:`executors.config.drain_period`): its workers take tasks for their first minute only."""
    executor = loaded.config.executor
    margin = getattr(executor, "drain_margin_s", None)
    if getattr(executor, "walltime", None) is None or margin is None:
        return []
    if in_one_allocation(executor):
        jobs = {"the one allocation": executor.walltime}
    else:
        blocks = {"gpu": executor.gpu, "cpu": executor.cpu}
        jobs = {f"the {name} block": job_walltime(executor, b) for name, b in blocks.items() if b}
    return [
        f"executor.drain_margin_s ({margin:,} s) is not below the walltime of {job} ({walltime}) by a "
        f"minute: its workers take tasks for their first {MIN_DRAIN_PERIOD_S} s only; lower "
        "executor.drain_margin_s or ask a longer walltime"
        for job, walltime in jobs.items()
        if walltime_seconds(walltime) - margin < MIN_DRAIN_PERIOD_S
    ]


def _beyond_allocation(
    loaded: LoadedConfig, points: list[Any], estimates: dict[int, PointEstimate | None]
) -> list[str]:
    """A warning when, under ``executor.allocation: one``, the points to run outlast the one job: they run
    one after another inside it, so their query windows and the upload and index time the resource plan
    expects (``estimates``: id of a point -> PointEstimate, when the row count is known) add up."""
    executor = loaded.config.executor
    if not in_one_allocation(executor) or not points:
        return []
    windows = sum(query_cost(point)[1] for point in points)
    loads = sum(load_s(p, e) for p in points if (e := estimates.get(id(p))) is not None)
    # Workers take no task after their drain period (the walltime less drain_margin_s), as Parsl is told.
    margin = executor.drain_margin_s or 0
    drained = drain_period(executor.walltime, executor.drain_margin_s)
    if windows + loads <= (drained if drained is not None else walltime_seconds(executor.walltime)):
        return []
    taken = [f"at least {duration(windows)} of measured query windows"] if windows else []
    taken += [f"about {duration(loads)} of upload and index by the resource plan"] if loads else []
    usable = f", less its {duration(margin)} drain margin (executor.drain_margin_s)" if margin else ""
    fewer = "settings (or shorter vdb.query.duration_s)" if windows else "rows (vdb.insert.rows)"
    return [
        f"the {len(points):,} point(s) to run take {' and '.join(taken)}, one after another inside the one "
        f"allocation, more than its walltime ({executor.walltime}, executor.walltime){usable}: ask a longer "
        f"walltime, run fewer points or {fewer}, or the job ends before the run does"
    ]
