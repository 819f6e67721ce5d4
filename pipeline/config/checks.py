"""Cross-field checks of a run config that need several sections at once.

A queue's node, walltime and per-user job limits (the scheduler's, read live inside validate/plan, else
the config's table: executors/queues.py), image files, storage media a platform offers, and the database
cluster's shape are reported by :func:`check_platform` as ``(field path, message)`` pairs. Rules that concern
one database live in its folder (``apps/vdb/<name>/checks.py``), reached through the registry.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from apps.vdb import database
from apps.vdb.base import DatabaseError
from apps.vdb.cluster.checks import ClusterCheck, Problem
from apps.vdb.cluster.config import DatabaseClusterConfig, image_for
from apps.vdb.cluster.layout import absolute, node_shape, plan_cluster
from executors import queues
from executors.allocation import in_one_allocation, job_walltime, job_walltime_field, nodes_needed
from executors.config import HPC_PLATFORMS, QueueLimits, bind_lists, walltime_seconds
from executors.queues import QueueTable


class _Job(NamedTuple):
    """A batch job the run submits, as its queue's limits see it."""

    name: str  # for a message: "the gpu block", "the database job", "the one allocation"
    nodes_at: tuple  # the config field of its node count
    queue: str
    nodes: int
    walltime: str
    walltime_at: tuple  # the config field its walltime comes from


def _blocks(executor: Any, vdb: Any) -> Iterable[_Job]:
    """Every batch job the run submits."""
    queue = getattr(executor, "queue", None) or getattr(executor, "partition", "")
    if in_one_allocation(executor):  # one job holding every role's nodes
        nodes = sum(nodes_needed(executor, vdb))
        yield _Job("the one allocation", ("executor", "allocation"), queue, nodes, executor.walltime,
                   ("executor", "walltime"))  # fmt: skip
        return
    for label in ("gpu", "cpu"):
        block = getattr(executor, label)
        if block is not None:
            yield _Job(
                f"the {label} block",
                ("executor", label, "nodes_per_block"),
                block.queue or queue,
                block.nodes_per_block,
                job_walltime(executor, block),
                job_walltime_field(executor, block, ("executor", label, "walltime")),
            )
    cluster = getattr(vdb, "cluster", None) if vdb else None
    if cluster is not None:
        for name in (db.name for db in vdb.pilot_databases()):
            c = cluster.for_database(name)
            yield _Job(
                "the database job",  # alike for every database: one line, as for one job
                cluster.field_path(name, "nodes"),
                c.queue or queue,
                c.nodes,
                job_walltime(executor, c),
                job_walltime_field(executor, c, cluster.field_path(name, "walltime")),
            )


def _queue_problems(executor: Any, vdb: Any, table: QueueTable | None = None) -> list[Problem]:
    """Each job against its queue's node and walltime limits (``table``: by default :func:`queues.current`,
    the scheduler's live limits inside validate/plan, else the config's table)."""
    problems: list[Problem] = []
    table = table or queues.current(executor)
    if not table.limits and not table.live:
        return problems
    for job in _blocks(executor, vdb):
        loc, queue, nodes, walltime, wloc = job.nodes_at, job.queue, job.nodes, job.walltime, job.walltime_at
        # A walltime several jobs share (executor.walltime) names the job each line is about.
        whose = f"{job.name}: " if wloc == ("executor", "walltime") else ""
        limits = table.limits.get(queue)
        if limits is None:
            own = getattr(executor, "queue", None) or getattr(executor, "partition", None)
            where = ("executor", "queue" if hasattr(executor, "queue") else "partition")
            problems.append((where if queue == own else (*loc[:-1], "queue"), table.missing(queue)))
            continue
        if not limits.accepts_nodes(nodes):
            most = limits.max_nodes if limits.max_nodes is not None else "any"
            problems.append(
                (loc, f"queue {queue!r} accepts {limits.min_nodes}-{most} nodes per job, not {nodes}")
            )
        if limits.max_walltime and walltime_seconds(walltime) > walltime_seconds(limits.max_walltime):
            problems.append(
                (wloc, f"{whose}queue {queue!r} allows at most {limits.max_walltime}, not {walltime}")
            )
        if limits.min_walltime and walltime_seconds(walltime) < walltime_seconds(limits.min_walltime):
            problems.append(
                (wloc, f"{whose}queue {queue!r} needs at least {limits.min_walltime}, not {walltime}")
            )
        if limits.routes and limits.accepts_nodes(nodes):
            route = limits.route(nodes)
            if route is None:
                spans = ", ".join(f"{r.queue} {r.min_nodes}-{r.max_nodes}" for r in limits.routes)
                problems.append((loc, f"queue {queue!r} routes no queue for {nodes} nodes ({spans})"))
            elif walltime_seconds(walltime) > walltime_seconds(route.max_walltime):
                problems.append(
                    (
                        wloc,
                        f"{whose}queue {queue!r} routes {nodes}-node jobs to {route.queue!r} "
                        f"({route.min_nodes}-{route.max_nodes} nodes), which grants at most "
                        f"{route.max_walltime}, not {walltime}",
                    )
                )
    return list(dict.fromkeys(problems))  # a shared block is reported once


# --- per-user limits: the jobs a run needs at once ---------------------------------------------------------

ONE_ALLOCATION_HINT = "use one allocation (executor.allocation: one)"


@dataclass(frozen=True)
class HeldJob:
    """Batch jobs of one kind that a run has in a queue at the same time.

    ``running``: how many must run together for the run to progress; ``queued``: how many it may have
    submitted (queued or running) at once.
    """

    name: str  # e.g. "executor.cpu", "vdb milvus pilot"
    loc: tuple  # field path of the queue the jobs go to
    queue: str
    nodes: int
    running: int
    queued: int


def jobs_held_at_once(executor: Any, vdb: Any) -> list[list[HeldJob]]:
    """The sets of batch jobs a run holds at the same time: one set per database pilot job.

    A database point runs only while its pilot job and the client block run together (the pilot waits
    for the client block: pipeline/vdb_stages.py), and points run one after another, so each set is the
    client block (``executor.cpu``, else ``executor.gpu``), one database's pilot, and the blocks Parsl
    keeps although idle (``min_blocks``); Parsl releases the other idle blocks. ``queued`` counts every
    block Parsl may submit (``max_blocks``). Without pilot jobs nothing must run together: no set.
    """
    cluster = getattr(vdb, "cluster", None) if vdb else None
    if cluster is None or not executor.platform or not hasattr(executor, "gpu"):
        return []
    if in_one_allocation(executor):  # a single job: no per-user limit is below one
        return []
    queue = getattr(executor, "queue", None) or getattr(executor, "partition", "")
    own = ("executor", "queue" if hasattr(executor, "queue") else "partition")
    client = "cpu" if executor.cpu is not None else "gpu"
    blocks: list[HeldJob] = []
    for label in ("gpu", "cpu"):
        block = getattr(executor, label)
        if block is None:
            continue
        running = max(1, block.min_blocks) if label == client else block.min_blocks
        blocks.append(
            HeldJob(
                f"executor.{label}",
                ("executor", label, "queue") if block.queue else own,
                block.queue or queue,
                block.nodes_per_block,
                running,
                block.max_blocks,
            )
        )
    sets = []
    for name in (db.name for db in vdb.pilot_databases()):
        c = cluster.for_database(name)
        pilot = HeldJob(
            f"vdb {name} pilot",
            cluster.field_path(name, "queue") if c.queue else own,
            c.queue or queue,
            c.nodes,
            1,
            1,
        )
        sets.append([*blocks, pilot])
    return sets


def _execution_queue(limits: QueueLimits, nodes: int) -> tuple[str | None, Any]:
    """(name of the execution queue a job lands in or None for the queue itself, its per-user limits)."""
    route = limits.route(nodes) if limits.routes else None
    return (route.queue, route) if route is not None else (None, limits)


def per_user_limit_problems(executor: Any, vdb: Any, table: QueueTable | None = None) -> list[Problem]:
    """Problems where the jobs a run holds at once (:func:`jobs_held_at_once`) exceed a queue's per-user
    limits: more must run together than the queue runs per user (the run would wait for itself until the
    pilot's start-up times out), more than it queues per user (qsub refuses the rest), or more nodes than
    it runs per user. Routed jobs count against the execution queue they are routed to."""
    table = table or queues.current(executor)
    problems: list[Problem] = []
    for held in jobs_held_at_once(executor, vdb):
        # (queue, execution queue it routes to) -> (its per-user limits, the jobs that land there)
        groups: dict[tuple[str, str | None], tuple[Any, list[HeldJob]]] = {}
        for job in held:
            limits = table.limits.get(job.queue)
            if limits is None or not limits.accepts_nodes(job.nodes):
                continue  # reported by _queue_problems
            target, per_user = _execution_queue(limits, job.nodes)
            groups.setdefault((job.queue, target), (per_user, []))[1].append(job)
        for (queue, target), (per_user, jobs) in groups.items():
            named = f"queue {queue!r}" + (f" (routed to {target!r})" if target else "")
            running = [j for j in jobs if j.running]
            loc = next((j.loc for j in reversed(jobs) if j.name.startswith("vdb ")), jobs[0].loc)
            count, submitted = sum(j.running for j in running), sum(j.queued for j in jobs)
            nodes = sum(j.nodes * j.running for j in running)
            # (the limit, what the run needs of it, the verb, the unit (one, several), what the run does)
            for most, need, verb, unit, this_run in (
                (
                    per_user.max_running_per_user,
                    count,
                    "runs",
                    ("job", "jobs"),
                    f"this run holds {count} at once ({_names(running)}): {ONE_ALLOCATION_HINT}",
                ),
                (
                    per_user.max_queued_per_user,
                    submitted,
                    "queues",
                    ("job", "jobs"),
                    f"this run may submit {submitted} at once ({_names(jobs, queued=True)}): lower "
                    f"max_blocks or {ONE_ALLOCATION_HINT}",
                ),
                (
                    per_user.max_running_nodes_per_user,
                    nodes,
                    "runs",
                    ("nodes", "nodes"),
                    f"this run holds {nodes} at once ({_names(running)})",
                ),
            ):
                if most is not None and need > most:
                    amount = f"{most} {unit[0] if most == 1 else unit[1]}"
                    problems.append((loc, f"{named} {verb} at most {amount} per user; {this_run}"))
    return list(dict.fromkeys(problems))


def _names(jobs: list[HeldJob], queued: bool = False) -> str:
    parts = []
    for job in jobs:
        count = job.queued if queued else job.running
        parts.append(job.name if count == 1 else f"{job.name} x{count}")
    return ", ".join(parts)


def _database_problems(run_config: Any, name: str, base_dir: Path | None) -> list[Problem]:
    """Problems of one database's cluster (the block with that database's overrides applied)."""
    executor, vdb = run_config.executor, run_config.vdb
    block: DatabaseClusterConfig = vdb.cluster
    c = block.for_database(name)
    offered = getattr(executor, "storage_media", ["memory", "ssd", "lustre", "daos"])
    ranks, per_node = c.workers, c.workers_per_node
    check = ClusterCheck(
        name=name,
        block=block,
        cluster=c,
        platform=executor.platform,
        media=tuple(offered),
        collection_shards=vdb.collection.shards,
        base_dir=base_dir,
        workers_fit=c.nodes * per_node >= ranks,
    )
    at = check.at

    problems: list[Problem] = []
    if not check.workers_fit:
        problems.append(
            (at("workers"), f"{name}: {ranks} workers do not fit on {c.nodes} node(s) x {per_node}")
        )
    elif math.ceil(ranks / per_node) < c.nodes:
        problems.append((at("nodes"), f"{name}: {c.nodes} nodes for {ranks} workers leaves nodes idle"))
    if c.base_port + ranks * c.port_stride > 65535:
        problems.append((at("base_port"), f"{name}: ports of {ranks} ranks exceed 65535"))
    node = getattr(executor, "node", None)
    if node is not None and bind_lists(node, per_node, c.cores_per_worker) is None:
        problems.append(
            (
                at("cores_per_worker"),
                f"{name}: {per_node} ranks x {c.cores_per_worker} cores do not fit one socket each "
                f"({node.sockets} x {node.cores_per_socket} cores, reserved {node.reserved_cores})",
            )
        )

    if c.runtime == "native":
        problems += _native_problems(run_config, name, base_dir)
    else:
        settings = next((db for db in vdb.databases if db.name == name), None)
        field, path = image_for(c, name, settings)
        if not path:
            problems.append((("vdb", "cluster", "images", field), f"no Apptainer image for {name}"))
        elif not check.exists(path):
            problems.append((("vdb", "cluster", "images", field), f"image {path} does not exist"))

    storage = c.storage
    if storage.medium not in offered:
        problems.append(
            (
                at("storage", "medium"),
                f"{executor.platform} offers {', '.join(offered)}; not {storage.medium}",
            )
        )
    elif storage.medium == "ssd" and not storage.ssd_path:
        problems.append((at("storage", "ssd_path"), "medium ssd needs ssd_path (node-local directory)"))
    elif storage.medium == "lustre":
        if not storage.lustre_path:
            problems.append((at("storage", "lustre_path"), "medium lustre needs lustre_path"))
        elif not absolute(storage.lustre_path, base_dir).is_dir():
            problems.append((at("storage", "lustre_path"), f"directory {storage.lustre_path} does not exist"))
    elif storage.medium == "daos" and storage.daos is None:
        problems.append((at("storage", "daos"), "medium daos needs a daos section (pool, container)"))
    problems += database(name).cluster_problems(check)  # the database's own rules
    return problems


def _native_problems(run_config: Any, name: str, base_dir: Path | None) -> list[Problem]:
    """Runtime native: the executable exists and the database can lay its ranks out without an image."""
    cluster: DatabaseClusterConfig = run_config.vdb.cluster
    executable = cluster.executables.get(name)
    where = ("vdb", "cluster", "executables", name)
    if executable and not absolute(executable, base_dir).is_file():
        return [(where, f"executable {executable} does not exist")]
    settings = next(db for db in run_config.vdb.databases if db.name == name)
    try:
        plan_cluster(settings, cluster, node_shape(run_config.executor), Path("/nonexistent"), base_dir)
    except DatabaseError as exc:
        field, _, message = str(exc).partition(": ")
        path = tuple(field.split(".")) if field.startswith("vdb.cluster") else ("vdb", "cluster")
        return [(path, message if path != ("vdb", "cluster") else str(exc))]
    return []


def _cluster_problems(run_config: Any, base_dir: Path | None) -> list[Problem]:
    vdb, executor = run_config.vdb, run_config.executor
    cluster: DatabaseClusterConfig = vdb.cluster
    problems: list[Problem] = []
    wanted = {"polaris": "mpiexec", "aurora": "mpiexec", "slurm": "srun", "local": "local"}[executor.platform]
    if cluster.launcher != wanted and not (cluster.launcher == "local" and cluster.nodes == 1):
        problems.append(
            (("vdb", "cluster", "launcher"), f"platform {executor.platform} starts ranks with {wanted!r}")
        )
    for i, db in enumerate(vdb.databases):  # the cluster starts the servers: no external ones
        problems += database(db.name).settings_problems(db, i, vdb.collection.shards)
    for name in cluster.overrides:
        if name not in {db.name for db in vdb.databases}:
            problems.append((("vdb", "cluster", "overrides", name), f"{name} is not in vdb.databases"))
    for name in (db.name for db in vdb.pilot_databases()):
        problems += _database_problems(run_config, name, base_dir)
        problems += _walltime_problems(run_config, name)
    return list(dict.fromkeys(problems))


def _walltime_problems(run_config: Any, name: str) -> list[Problem]:
    """The database job must outlive the stages it serves: rank start-up, every insert sweep and the index.

    A job that reaches its walltime first is killed by the scheduler mid-stage, so the run fails after
    spending the allocation; the queries' own time comes on top and is the user's margin.
    """
    vdb, executor = run_config.vdb, run_config.executor
    c = vdb.cluster.for_database(name)
    walltime = job_walltime(executor, c)  # under one allocation the one job's: the cluster's is not asked
    insert = vdb.insert
    needed = c.startup_timeout_s + len(insert.batch_sizes) * insert.timeout_s + vdb.index_timeout_s
    if needed < walltime_seconds(walltime):
        return []
    where = job_walltime_field(executor, c, vdb.cluster.field_path(name, "walltime"))
    job = "the one allocation's walltime" if in_one_allocation(executor) else "the database job's walltime"
    return [
        (
            where,
            f"{name}: {job} {walltime} ({walltime_seconds(walltime)} s) does not "
            f"outlast its stage timeouts: startup {c.startup_timeout_s:.0f} + "
            f"{len(insert.batch_sizes)} insert sweep(s) x {insert.timeout_s:.0f} + index "
            f"{vdb.index_timeout_s:.0f} = {needed:.0f} s; lower vdb.insert.timeout_s / "
            "vdb.index_timeout_s or ask a longer walltime",
        )
    ]


def check_platform(run_config: Any, base_dir: Path | None = None) -> list[Problem]:
    """Problems that need several sections at once, as (field path, message); empty when all is well.

    ``base_dir`` resolves relative image and storage paths (the config file's directory).
    """
    executor = run_config.executor
    vdb = getattr(run_config, "vdb", None)
    cluster = getattr(vdb, "cluster", None) if vdb else None
    problems: list[Problem] = []
    if executor.platform in HPC_PLATFORMS:
        account = getattr(executor, "account", None)
        if executor.platform != "slurm" and not (account or "").strip():
            problems.append((("executor", "account"), "an account (project) is required"))
        unswept = None if vdb and vdb.swept else vdb  # sweeps: per point
        problems += _queue_problems(executor, unswept) + per_user_limit_problems(executor, unswept)
        gpu = executor.gpu
        if len(gpu.accelerator_ids) > executor.node.gpus * 2:  # tiles count twice at most
            problems.append((("executor", "gpu", "accelerators"), f"a node has {executor.node.gpus} GPUs"))
    if cluster is not None and vdb.swept:
        problems += _point_problems(run_config, base_dir)
    elif cluster is not None:
        problems += _cluster_problems(run_config, base_dir)
    return list(dict.fromkeys(problems))


def _point_problems(run_config: Any, base_dir: Path | None) -> list[Problem]:
    """A sweep: every deployment shape checked as the point that runs it (apps/vdb/sweep.py), each
    problem at the field as written, with the index of the point's value when the field is swept."""
    vdb = run_config.vdb
    problems: list[Problem] = []
    for name in vdb.cluster.overrides:
        if name not in {db.name for db in vdb.databases}:
            problems.append((("vdb", "cluster", "overrides", name), f"{name} is not in vdb.databases"))
    seen: set[int] = set()
    for point in vdb.points:
        if id(point.config) in seen:  # repeats share their point's configuration
            continue
        seen.add(id(point.config))
        own = point.config.cluster.model_copy(
            # the point's own overrides: an entry may override (or clear) the shared ones
            update={
                "overrides": {k: v for k, v in point.config.cluster.overrides.items() if k == point.database}
            }
        )
        config = run_config.model_copy(update={"vdb": point.config.model_copy(update={"cluster": own})})
        executor, found = config.executor, []
        if executor.platform in HPC_PLATFORMS:
            found = _queue_problems(executor, config.vdb) + per_user_limit_problems(executor, config.vdb)
        for loc, message in found + _cluster_problems(config, base_dir):
            if loc[:1] == ("vdb",):
                loc = ("vdb", *vdb.written_loc(point, tuple(loc[1:])))
            problems.append((loc, message))
    return problems
