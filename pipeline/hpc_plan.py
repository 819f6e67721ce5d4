"""What ``python -m pipeline plan`` shows for an HPC run: Parsl config, job scripts, server commands.

Job scripts are produced by the Parsl providers themselves: the provider's ``submit`` runs with its
scheduler command (``qsub``/``sbatch``) replaced by a stub, so the script is exactly the one Parsl would
hand to the scheduler. Nothing is submitted and no server starts.

Entry points: :func:`check_or_raise` (plan/validate time), :func:`render_artifacts` (name -> text,
used by the golden tests) and :func:`render_plan` (one printable text).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from executors.config import HPC_PLATFORMS
from executors.safe import safe_path_problem
from pipeline.config.checks import check_platform
from pipeline.config.loader import LoadedConfig
from pipeline.config.yaml_guard import dotted_path

RUN_ID = "<run-id>"
ADDRESS = "<login-node-address>"
WORKER_PORT = "<interchange-worker-port>"
_OBJECT_ID = re.compile(r" at 0x[0-9a-f]+")


def shell_problems(loaded: LoadedConfig) -> list[tuple[tuple, str]]:
    """Values that are valid alone but not where they land: the work directory as resolved (the current
    directory or home may hold spaces or ``$``; Parsl writes it unquoted into job scripts and the submit
    command), and the database job's directive lines, which must be the platform's scheduler's."""
    cfg = loaded.config
    problems = []
    problem = safe_path_problem(str(cfg.workdir_path))
    if problem:
        problems.append((("workdir",), problem))
    prefix = {"polaris": "#PBS", "aurora": "#PBS", "slurm": "#SBATCH"}.get(cfg.executor.platform)
    if prefix and cfg.vdb and cfg.vdb.cluster:
        for i, line in enumerate(cfg.vdb.cluster.scheduler_options):
            if line.split()[0] != prefix:
                where = ("vdb", "cluster", "scheduler_options", i)
                problems.append((where, f"{cfg.executor.platform} needs {prefix} lines"))
    return problems


def check_or_raise(loaded: LoadedConfig) -> None:
    """Raise one ConfigError listing every platform problem, each with its line and field path."""
    problems = shell_problems(loaded) + check_platform(loaded.config, loaded.base_dir)
    if not problems:
        return
    # In the file's order, each problem once: a directory several entries share (a YAML anchor) is one
    # line, naming the other fields that hold it.
    placed = sorted(
        ((loaded.line_at(loc), loc, text) for loc, text in problems),
        key=lambda item: (item[0] is None, item[0] or 0),
    )
    fields: dict[str, list[tuple[int | None, tuple]]] = {}
    for line, loc, text in placed:
        fields.setdefault(text, []).append((line, loc))
    listed = []
    for text, ((line, loc), *others) in fields.items():
        by_line: dict[int | None, list[str]] = {}  # in line order: the fields on this line come first
        for at, other in others:
            by_line.setdefault(at, []).append(dotted_path(other))
        groups = [_on_line(at, line) + ", ".join(names) for at, names in by_line.items()]
        written = loaded.written_as(loc)  # a value from the environment: the variable is named
        facts = ([f"written as {written}"] if written else []) + (
            [f"also {'; '.join(groups)}"] if others else []
        )
        shown = f" ({'; '.join(facts)})" if facts else ""
        listed.append((line, f"{dotted_path(loc)}: {text}{shown}"))
    if len(listed) == 1:  # as every one-problem config error reads: file:line: field: what is wrong
        message = loaded.where_prefix + listed[0][1]
    else:
        lines = [f"{f'line {line}: ' if line else ''}{problem}" for line, problem in listed]
        message = f"{loaded.where_prefix}platform check failed:\n  " + "\n  ".join(lines)
    raise ConfigError(message, file=str(loaded.shown_path), line=placed[0][0])


def _on_line(at: int | None, first: int | None) -> str:
    """The prefix of a group of fields on line ``at`` beside a problem named at line ``first``: none on
    the same line; a field the file does not write (a default) is said to be so, not left unprefixed."""
    if at == first:
        return ""
    return f"line {at}: " if at is not None else "not in the file: "


def _run_dir(loaded: LoadedConfig) -> Path:
    return loaded.config.runs_dir / RUN_ID


def placeholder_split(loaded: LoadedConfig) -> Any:
    """The nodes of a one-allocation job by role, as placeholders (``<gpu-node-1>``, ...)."""
    from executors.allocation import NodeSplit, nodes_needed

    gpu, cpu, databases = nodes_needed(loaded.config.executor, loaded.config.vdb)
    return NodeSplit(
        *(
            [f"<{role}-node-{i + 1}>" for i in range(n)]
            for role, n in (("gpu", gpu), ("cpu", cpu), ("db", databases))
        )
    )


def one_allocation(loaded: LoadedConfig) -> bool:
    """True when the run is one batch job (``executor.allocation: one``)."""
    from executors.allocation import in_one_allocation

    return in_one_allocation(loaded.config.executor)


def parsl_config(loaded: LoadedConfig, run_dir: Path | None = None, address: str = ADDRESS) -> Any:
    """The Parsl Config the run would load, with a placeholder login-node address (and, in one
    allocation, placeholder nodes)."""
    from executors.platforms import parsl_config_for

    split = placeholder_split(loaded) if one_allocation(loaded) else None
    return parsl_config_for(
        loaded.config.executor,
        run_dir or _run_dir(loaded),
        address=address,
        split=split,
        gpu_on_demand=loaded.config.gpu_on_demand,
    )


def submit_script(provider: Any, command: str, job_name: str, script_dir: str) -> tuple[str, str]:
    """(script, submit command) exactly as ``provider.submit`` writes them, with the scheduler stubbed."""
    calls: list[str] = []
    fake_out = "Submitted batch job 1\n" if provider.label == "slurm" else "1.pbs\n"

    def execute_wait(cmd: str, timeout: float | None = None) -> tuple[int, str, str]:
        calls.append(cmd)
        return 0, fake_out, ""

    with tempfile.TemporaryDirectory() as tmp:
        provider.script_dir = tmp
        provider.execute_wait = execute_wait  # instance attribute: the real method stays untouched
        provider.submit(command, 1, job_name)
        written = [p for p in Path(tmp).iterdir() if p.is_file() and not p.name.endswith(".nodes")]
        script = written[0].read_text()
        actual_name = written[0].name
        submit = calls[0] if calls else ""
    del provider.execute_wait
    # Stable text: the provider's timestamped name and temporary directory become the real ones.
    for text_name in ("script", "submit"):
        text = script if text_name == "script" else submit
        text = text.replace(tmp, script_dir).replace(actual_name, job_name)
        if text_name == "script":
            script = text
        else:
            submit = text
    return script, submit


def _htex_command(executor: Any, parsl_run_dir: str) -> str:
    """The worker-pool command the HighThroughputExecutor hands to its provider for block 0."""
    executor.run_dir = parsl_run_dir
    executor.cert_dir = f"{executor.logdir}/certificates"
    executor.logconf_path = None
    executor.worker_port = WORKER_PORT
    executor.initialize_scaling()
    return executor._get_launch_command("0")


def _executor_scripts(config: Any, run_dir: Path) -> dict[str, str]:
    """The job script of every provider-backed executor (its block 0), headed by its submit command; in
    one allocation, the script its LocalProvider runs inside the job (never started here)."""
    from parsl.providers import LocalProvider

    parsl_run_dir = str(run_dir / "parsl" / "000")  # the DFK's first run directory
    out: dict[str, str] = {}
    for ex in config.executors:
        if not hasattr(ex, "provider"):
            continue
        command = _htex_command(ex, parsl_run_dir)
        if isinstance(ex.provider, LocalProvider):
            p = ex.provider
            launch = p.launcher(command, 1, p.nodes_per_block, f"{parsl_run_dir}/submit_scripts")
            script = f"{p.worker_init}\n{launch}"
            out[f"block-{ex.label}.sh"] = f"# started inside the allocation on its first node\n{script}"
            continue
        script, submit = submit_script(
            ex.provider, command, f"parsl.{ex.label}.block-0", f"{parsl_run_dir}/submit_scripts"
        )
        out[f"job-{ex.label}.sh"] = f"# submit: {submit}\n{script}"
    return out


def _normalise(text: str) -> str:
    return _OBJECT_ID.sub(" at 0x...", text)


def pilot_shapes(vdb: Any) -> list[tuple[Any, list[Any]]]:
    """(first point, every point) of each distinct database job shape the sweep deploys, in run order.

    A shape is the database's settings and its cluster block (overrides applied): points that differ only
    in insert, index or query knobs (or repeats) share their first point's job script. In-process engines
    (Qdrant edge) have no pilot job.
    """
    from apps.vdb import runs_in_process

    shapes: dict[str, tuple[Any, list[Any]]] = {}
    for point in vdb.points:
        if runs_in_process(point.settings):
            continue
        cluster = point.config.cluster.for_database(point.database)
        shape = repr(
            (point.settings.model_dump(mode="json"), cluster.model_dump(mode="json", exclude={"overrides"}))
        )
        shapes.setdefault(shape, (point, []))[1].append(point)
    return list(shapes.values())


def _cluster_artifacts(loaded: LoadedConfig, directories: dict[int, Path] | None) -> dict[str, str]:
    from apps.vdb.cluster.layout import node_shape, plan_cluster
    from apps.vdb.cluster.provider import cluster_provider
    from apps.vdb.cluster.render import LAUNCH_SH, LIB_SH, describe_ranks, launcher_command, render_files
    from executors.providers import rerunnable
    from pipeline.sweep import POINTS_DIR, slug

    cfg = loaded.config
    node = node_shape(cfg.executor)
    store = cfg.store_dir
    out: dict[str, str] = {}
    for number, (point, _points) in enumerate(pilot_shapes(cfg.vdb)):
        settings = point.settings
        cluster = point.config.cluster.for_database(settings.name)
        point_dir = (directories or {}).get(number) or store / POINTS_DIR / f"<{slug(point.label)}-key>"
        rerun = rerunnable(cfg.executor, cluster.queue)
        layout = plan_cluster(settings, cluster, node, point_dir / "server", loaded.base_dir, rerun)
        db = slug(point.label)
        if one_allocation(loaded):  # started inside the run's job, on the database nodes
            hosts = placeholder_split(loaded).databases
            provider = cluster_provider(cfg.executor, cluster, hosts, layout.directory)
            command = launcher_command(layout, cluster, node, hosts)
            out[f"{db}/job.sh"] = f"# started inside the allocation\n{provider.worker_init}\n{command}\n"
        else:
            command = launcher_command(layout, cluster, node)
            provider = cluster_provider(cfg.executor, cluster)
            script, submit = submit_script(
                provider, command, f"pes2o-vdb.{layout.cluster_id}", str(layout.directory / "jobs")
            )
            out[f"{db}/job.sh"] = f"# submit: {submit}\n{script}"
        # Every rank in brief (environment and command), the first two scripts in full.
        out[f"{db}/servers.txt"] = describe_ranks(layout, cluster)
        files = render_files(layout, cluster)
        for spec in layout.ranks[:2]:
            out[f"{db}/rank-{spec.rank:03d}.sh"] = files[f"ranks/rank-{spec.rank:03d}.sh"]
        out.setdefault("cluster-lib.sh", LIB_SH)
        out.setdefault("cluster-launch.sh", LAUNCH_SH)
    return out


def render_artifacts(loaded: LoadedConfig, directories: dict[int, Path] | None = None) -> dict[str, str]:
    """Every artifact of an HPC run: name -> text (Parsl config, job scripts, per-rank server files).

    ``directories``: the point directory of each database job shape (:func:`pilot_shapes` order), from the
    plan; placeholders (``<store>/vdb-points/<label-key>``) without one.
    """
    cfg = loaded.config
    if cfg.executor.platform not in HPC_PLATFORMS:
        return {}
    run_dir = _run_dir(loaded)
    config = parsl_config(loaded, run_dir)
    out = {"parsl-config.txt": _normalise(repr(config)) + "\n"}
    if one_allocation(loaded):  # the script submit_and_wait hands to the scheduler
        from pipeline import allocation_job

        provider, command = allocation_job.allocation_job(loaded)
        script, submit = submit_script(
            provider, command, allocation_job.JOB_NAME, str(allocation_job.job_directory(loaded))
        )
        out["job-allocation.sh"] = f"# submit: {submit}\n{script}"
    out.update(_executor_scripts(config, run_dir))
    if cfg.vdb and cfg.vdb.cluster:
        out.update(_cluster_artifacts(loaded, directories))
    return out


def _summary(loaded: LoadedConfig) -> str:
    from apps.vdb.cluster.layout import core_ranges, node_shape, plan_cluster

    cfg = loaded.config
    ex = cfg.executor
    lines = [f"platform {ex.platform}: login-node address from interface {ex.interface or '(all)'}"]
    blocks = [("workers (GPU)", ex.gpu.nodes_per_block, ex.gpu.max_blocks, len(ex.gpu.accelerator_ids) or 1)]
    if ex.cpu:
        blocks.append(("cpu", ex.cpu.nodes_per_block, ex.cpu.max_blocks, ex.cpu.workers_per_node))
    for label, nodes, max_blocks, per_node in blocks:
        lines.append(f"  {label}: {nodes} node(s) x up to {max_blocks} block(s), {per_node} workers per node")
        if label == "workers (GPU)" and cfg.gpu_on_demand:
            lines.append("    not started with the run: only for exact ground truth (the dataset is given)")
    if cfg.vdb and cfg.vdb.cluster:
        node = node_shape(ex)
        for point, points in pilot_shapes(cfg.vdb):
            settings, name = point.settings, point.label
            c = point.config.cluster.for_database(settings.name)
            lines.append(
                f"  {name} job: {c.nodes} node(s), {c.workers} rank(s), "
                f"{c.workers_per_node} per node, "
                f"{c.cores_per_worker} cores each, storage {c.storage.medium} ({c.storage.base_dir()})"
            )
            if len(points) > 1:  # one job per point: the same shape again for each
                lines.append(
                    f"    used by {len(points)} points: " + ", ".join(sorted({p.label for p in points}))
                )
            layout = plan_cluster(settings, point.config.cluster, node, Path("/"), loaded.base_dir)
            for r in layout.ranks:
                ports = " ".join(f"{k}={v}" for k, v in r.ports.items())
                lines.append(
                    f"    {name} rank {r.rank} {r.role:<13} slot {r.node_slot} "
                    f"cores {core_ranges(r.cores) or '-':<8} {ports}"
                )
    return "\n".join(lines)


def render_plan(loaded: LoadedConfig, directories: dict[int, Path] | None = None, check: bool = True) -> str:
    """The HPC part of ``plan``: checks, a summary, then every artifact under a heading ('' when local).

    ``check`` runs :func:`check_or_raise` first (off only to render configs whose files are elsewhere).
    """
    if loaded.config.executor.platform not in HPC_PLATFORMS:
        return ""
    if check:
        check_or_raise(loaded)
    parts = [_summary(loaded)]
    for name, text in render_artifacts(loaded, directories).items():
        parts.append(f"===== {name} " + "=" * max(3, 70 - len(name)) + f"\n{text.rstrip()}")
    return "\n\n".join(parts) + "\n"
