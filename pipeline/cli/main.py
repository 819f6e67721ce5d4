"""``python -m pipeline validate|plan|run|status|submit|report|compare|dataset``."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from core.errors import ArtifactError, PipelineError, os_message
from core.lifetime import Terminated, stop_on_sigterm
from pipeline.cli import results as cli_results
from pipeline.cli.dataset import app as dataset_app
from pipeline.cli.output import console, out, warn
from pipeline.cli.output import error as _error
from pipeline.cli.output import fail as _fail
from pipeline.config import variants
from pipeline.config.loader import LoadedConfig, dataset_entries, load_config

if TYPE_CHECKING:
    from pipeline.plan import Plan
    from pipeline.runs import RunRecord
    from pipeline.sweep import PointPlan

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Pes2o-VE pipeline: corpus -> embedding dataset -> vector-database benchmarks, with provenance.",
)
app.add_typer(dataset_app, name="dataset")
ConfigArg = Annotated[Path, typer.Argument(help="YAML run configuration")]
QueueLimitsOpt = Annotated[
    str,
    typer.Option(
        "--queue-limits",
        envvar="PES2O_QUEUE_LIMITS",
        help="Queue limits to check the jobs against: live (qstat -Qf / scontrol show partition, which must "
        "answer), table (the config's executor.queues) or auto (live where the command answers in a few "
        "seconds, else the table).",
    ),
]
QueueListingOpt = Annotated[
    Path | None,
    typer.Option(
        "--queue-listing",
        hidden=True,  # for tests and for checking a config against another site's saved output
        help="A saved qstat -Qf (PBS) or scontrol show partition (Slurm) output read instead of the command.",
    ),
]

UNSUCCESSFUL = ("failed", "lost", "interrupted")  # `status` exits 1 for a run that ended so


def _all_in_any_case(name: str | None) -> str | None:
    """``--dataset ALL`` as ``all`` (an entry cannot be named so)."""
    return variants.ALL if name is not None and name.lower() == variants.ALL else name


DatasetOpt = Annotated[
    str | None,
    typer.Option(
        "--dataset",
        help="An entry of the config's datasets section (a study's other datasets): that dataset's run; "
        f"the file's own dataset.name: its own. '{variants.ALL}': the file's own dataset, then every entry, "
        "in turn.",
        callback=_all_in_any_case,
    ),
]


def _endpoint_id(endpoint: str | None) -> str | None:
    """A Globus Compute endpoint id is a UUID: anything else is refused before signing in to Globus."""
    if endpoint is not None:
        try:
            uuid.UUID(endpoint)
        except ValueError:
            raise typer.BadParameter(
                f"{endpoint!r} is not an endpoint id (a UUID, as `globus-compute-endpoint list` prints)"
            ) from None
    return endpoint


def _datasets(config: Path, dataset: str | None) -> list[str | None]:
    """The datasets a command acts on: one entry (None: the file's own), or all of them."""
    if dataset != variants.ALL:
        return [dataset]
    try:
        return [None, *dataset_entries(config)]
    except PipelineError as exc:
        _fail(exc)


def _each_dataset(config: Path, dataset: str | None, action: Callable[[str | None], None]) -> None:
    """``action`` for the dataset(s) ``--dataset`` names. With ``all``, one that fails does not stop the
    others: the failed ones are listed at the end and the command exits with the worst status (an
    interrupt stops at once)."""
    entries = _datasets(config, dataset)
    failed: list[str] = []
    status = 0
    for entry in entries:
        try:
            action(entry)
        except typer.Exit as exc:
            if exc.exit_code in (0, 130) or dataset != variants.ALL:
                raise
            failed.append(entry or "the file's own")
            status = max(status, exc.exit_code)
    if failed:
        console.print(
            f"[red]{len(failed)} of {len(entries)} dataset(s) failed:[/] {', '.join(failed)}", highlight=False
        )
        raise typer.Exit(status)


def _load_plan(config: Path, dataset: str | None = None) -> tuple[LoadedConfig, Plan]:
    """Load and plan ``config`` (its ``datasets`` entry ``dataset``); a bad config ends the command with
    its message (no traceback)."""
    from pipeline.plan import build_plan

    try:
        loaded = load_config(config, dataset)
        return loaded, build_plan(loaded)
    except PipelineError as exc:
        _fail(exc)


def _other_datasets_line(loaded: LoadedConfig) -> None:
    """Name the file's other datasets when the command ran its own only."""
    if loaded.dataset_entry is None and loaded.dataset_entries:
        out.print(
            f"other datasets in this config: {', '.join(loaded.dataset_entries)} (--dataset NAME for one, "
            f"--dataset {variants.ALL} for every one)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


@contextmanager
def _queue_limits(mode: str, listing: Path | None) -> Iterator[None]:
    """Checks inside use the queue limits ``mode`` picks (executors/queues.py); a bad choice ends the
    command with its message."""
    from executors.queues import use_queue_limits

    try:
        with use_queue_limits(mode, listing):  # type: ignore[arg-type]  # checked there
            yield
    except PipelineError as exc:
        _fail(exc)


def _queue_limits_line(loaded: LoadedConfig) -> None:
    """Say which queue limits the checks used (HPC platforms only)."""
    from executors.queues import used_tables

    table = used_tables().get(loaded.config.executor.platform)
    if table is not None:
        out.print(f"queue limits: {table.source}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def validate(
    config: ConfigArg,
    queue_limits: QueueLimitsOpt = "auto",
    queue_listing: QueueListingOpt = None,
    dataset: DatasetOpt = None,
) -> None:
    """Check a configuration: syntax, fields, and that every path it names exists."""

    def one(entry: str | None) -> None:
        loaded, plan = _load_plan(config, entry)
        which = f" dataset {entry}" if entry else ""
        out.print(f"[green]valid[/]: {config}{which} (hash {loaded.config_hash[:12]}), {_input_line(plan)}")
        _resource_warnings(plan)
        _queue_limits_line(loaded)
        if dataset != variants.ALL:
            _other_datasets_line(loaded)

    with _queue_limits(queue_limits, queue_listing):
        _each_dataset(config, dataset, one)


@app.command()
def plan(
    config: ConfigArg,
    queue_limits: QueueLimitsOpt = "auto",
    queue_listing: QueueListingOpt = None,
    dataset: DatasetOpt = None,
) -> None:
    """Dry run: stages, content keys, shards, resources. Nothing is executed."""
    with _queue_limits(queue_limits, queue_listing):  # the same limits for both checks (plan, render)
        _each_dataset(config, dataset, lambda entry: _plan(config, entry, dataset != variants.ALL))


def _plan(config: Path, dataset: str | None, name_others: bool = True) -> None:
    loaded, the_plan = _load_plan(config, dataset)
    cfg = loaded.config
    which = f"  dataset {dataset}" if dataset else ""
    out.print(f"[bold]{cfg.name}[/]  config {loaded.shown_path}{which}  hash {loaded.config_hash[:12]}")
    if name_others:
        _other_datasets_line(loaded)
    if cfg.generates_dataset:
        total_bytes = sum(p.stat().st_size for p in the_plan.corpus_files)
        out.print(
            f"corpus: {len(the_plan.corpus_files)} file(s), {total_bytes / 2**20:,.1f} MiB "
            f"({cfg.corpus.format})"
        )
        if cfg.sharding.bytes_per_shard:
            out.print(f"sharding: ~{cfg.sharding.bytes_per_shard:,} text bytes per shard")
        else:
            out.print(f"sharding: {cfg.sharding.docs_per_shard:,} documents per shard")
        out.print(
            f"model: {cfg.embedding.model_id or cfg.embedding.model} -> dimension {the_plan.dimension}, "
            f"{cfg.embedding.backend}, {cfg.embedding.dtype}"
        )
    else:
        out.print(_input_line(the_plan), highlight=False, soft_wrap=True)
    if cfg.executor.platform == "local":
        out.print(f"executor: local, {cfg.executor.workers} worker processes on {cfg.executor.address}")
    else:
        out.print(f"executor: {cfg.executor.platform} (Parsl config and job scripts below)")
        _queue_limits_line(loaded)
    table = Table("stage", "content key", "status", "shards", "directory")
    problems: list[str] = []  # damaged files, named under the table
    for name, stage in the_plan.stages.items():
        status, shards, damaged = _stage_status(stage.directory, stage.parts)
        problems += damaged
        shown = name if stage.name == name else f"{name} ({stage.name})"  # embed (import): the dataset's role
        table.add_row(shown, stage.key, status, shards, str(stage.directory))
    from pipeline.headline import print_table

    print_table(out, table)  # whole: the directories are what a user copies from it
    _damaged_lines(problems)
    if the_plan.points:
        from pipeline.sweep import describe, sweep_cost

        lines = describe(the_plan.points)  # plain lines: labels hold brackets, and must not be cut
        out.print(f"vdb points ({len(lines)}, run in this order, one at a time):")
        for number, label, repeat, params, key, done in lines:
            state = "done" if done else "to run"
            text = f"  {number:>3}  {label}  repeat {repeat}  key {key}  {state}\n       {params}"
            out.print(text, markup=False, highlight=False, soft_wrap=True)
        _damaged_lines(
            [f"{line}: measured again by the next run" for p in the_plan.points for line in p.damage()]
        )
        estimates = {id(p): e for p, e in the_plan.resources.estimates} if the_plan.resources else {}
        from pipeline.hpc_plan import one_allocation

        cost = sweep_cost(cfg.vdb, the_plan.points, estimates, one_allocation(loaded))
        out.print(cost, markup=False, highlight=False, soft_wrap=True)
        _resource_table(the_plan)
    from pipeline.hpc_plan import render_plan

    directories = None
    if cfg.vdb and cfg.vdb.cluster:  # each database job shape renders in its first point's directory
        from pipeline.hpc_plan import pilot_shapes

        where = {id(p.point): p.directory for p in the_plan.points}
        directories = {i: where[id(first)] for i, (first, _) in enumerate(pilot_shapes(cfg.vdb))}
    hpc = render_plan(loaded, directories)  # Parsl config, job scripts, server commands (HPC only)
    if hpc:
        out.print(hpc, markup=False, highlight=False)


def _resource_table(plan: Plan) -> None:
    """Each point's estimated memory, data and time (pipeline/resources.py), and what did not fit."""
    resources = plan.resources
    if resources is None:
        return
    if resources.rows is None:
        out.print(
            "resources: not estimated: the dataset's row count is unknown until it is made "
            "(dataset.expected_rows gives it)",
            markup=False,
            highlight=False,
        )
        return
    table = Table(
        "point",
        "vectors",
        "ranks",
        "memory/rank",
        "memory/node",
        "data/node",
        "memory/client",
        "upload",
        "index",
        "figures of",
        title="resource plan (estimates; docs/vector-databases.md, Resource plan)",
    )
    for point, estimate in resources.estimates:  # escaped: labels hold brackets ([medium=memory])
        if estimate is None:
            table.add_row(escape(point.label), *[""] * 8, f"{point.database}: not measured, not checked")
        else:
            table.add_row(*map(escape, estimate.row()))
    from pipeline.headline import print_table

    print_table(out, table)
    out.print(_client_and_driver_line(plan), markup=False, highlight=False, soft_wrap=True)
    _resource_warnings(plan)


def _client_and_driver_line(plan: Plan) -> str:
    """How the client and driver figures were estimated, and the driver's."""
    from apps.vdb.resources import DRIVER_MEASURED_MIB
    from core.format import size

    resources = plan.resources
    cfg = plan.config
    # a point's vdb.query.max_queries may send fewer: its estimate (the table above) counts those
    queries = f"the dataset's {resources.queries:,} queries" if resources.queries else "its queries"
    assumed = "; 10,000 queries assumed where neither vdb.query.max_queries nor the dataset gives the count"
    prefix = (
        f", groundtruth.memory_budget_mb ({cfg.groundtruth.memory_budget_mb:,} MiB) for the exact top-k of "
        "the prefixes points load"
        if resources.prefix_truth
        else ""
    )
    return (
        f"memory/client: each client process (x how many share a client node) holds one row group of "
        f"{cfg.dataset.row_group_rows:,} rows or {queries} (vdb.query.max_queries, where fewer)"
        f"{assumed if resources.queries_assumed else ''}. driver (the DAG and the report): about "
        f"{size(resources.driver_memory)} ({DRIVER_MEASURED_MIB} MiB measured, the base vectors the report "
        f"fetches{prefix})"
    )


def _resource_warnings(plan: Plan) -> None:
    for line in plan.resources.warnings if plan.resources else []:
        warn(line)


def _input_line(plan: Plan) -> str:
    """What the run reads: its corpus and model, or the dataset it is given (its size, its source element
    type when not float32, and, on a second line, where its ground truth comes from)."""
    cfg = plan.config
    if cfg.generates_dataset:
        return f"{len(plan.corpus_files)} corpus file(s), model {plan.model_dir}, dimension {plan.dimension}"
    dataset = plan.stage("embed")
    from core.store import complete_manifest

    how = "stored in"
    if dataset.name == "import":  # made by an earlier run or `dataset import` of the same files: done
        how = "imported into" if complete_manifest(dataset.directory) else "imported by the run into"
    rows, dtype = plan.file_metadata["rows"], plan.file_metadata["source_dtype"]
    size = f"{rows:,} vectors x {plan.dimension}" + (
        f" ({dtype}, stored as float32)" if dtype != "float32" else ""
    )
    size += f", {plan.synthetic_note}" if plan.synthetic_note else ""
    return (
        f"dataset {cfg.dataset.name}: {size}, {how} {dataset.directory}\n  ground truth: {plan.truth_source}"
    )


def _stage_status(directory: Path, parts: Sequence[PointPlan] = ()) -> tuple[str, str, list[str]]:
    """A stage output's status, its shard (or point) count, and what is damaged in it (redone by a run).

    A stage made of ``parts`` (the vdb stage's points) is complete only when they all are: a point lost
    or damaged since the stage finished shows it ``partial`` (the points list names which)."""
    from core.store import complete_manifest, shard_progress

    try:
        finished = complete_manifest(directory) is not None
    except ArtifactError as exc:  # a damaged manifest: named, and the table goes on
        return "[red]damaged[/]", "", [str(exc)]
    if parts:
        done = sum(part.complete for part in parts)
        if finished and done == len(parts):
            return "[green]complete[/]", "", []
        count = f"{done} of {len(parts)} points done"
        return ("[yellow]partial[/]", count, []) if done or finished else ("to run", "", [])
    if finished:
        return "[green]complete[/]", "", []
    done, damaged = shard_progress(directory)
    shards = f"{done} done" + (f", {len(damaged)} damaged" if damaged else "")
    redone = [f"{line}: redone by the next run" for line in damaged]
    return ("[yellow]partial[/]", shards, redone) if done or damaged else ("to run", "", [])


def _damaged_lines(damaged: list[str]) -> None:
    """Name what a run will redo and why (a file changed or cut short since it was written)."""
    for line in damaged:
        warn(line)


@app.command()
def run(config: ConfigArg, dataset: DatasetOpt = None) -> None:
    """Run the workflow; complete stages are reused, interrupted ones resume. Ends with the headline table.

    Its store and runs go under the config's workdir (in the shipped configs: $PIPELINE_WORKDIR, else the
    current directory); --workdir belongs to the commands that look a run up by its id.
    """
    _each_dataset(config, dataset, lambda entry: _run(config, entry))


def _run(config: Path, dataset: str | None) -> None:
    from pipeline import workflow

    try:
        loaded = load_config(config, dataset)
        from executors.allocation import in_one_allocation

        if in_one_allocation(loaded.config.executor):
            from pipeline import allocation_job

            if not allocation_job.inside_a_job():  # submit the run as one job; inside it, run below
                allocation_job.submit_and_wait(loaded, console)
                return
        run_dir = workflow.run(loaded, console)
    except PipelineError as exc:
        _fail(exc)
    except OSError as exc:  # e.g. disk full or permissions changed mid-run
        _error(os_message(exc), 1)
    except Terminated:  # SIGTERM: 128 + 15, as a shell reports a process it ended
        console.print("[red]terminated[/] (SIGTERM): what the run started is stopped")
        raise typer.Exit(143) from None
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]")
        raise typer.Exit(130) from None
    except Exception as exc:  # a lost worker, a library error: one line here, the traceback in the log
        from core.errors import describe
        from pipeline.dag import root_cause

        _error(f"{describe(root_cause(exc))} (the traceback is in the run's pipeline.log)", 1)
    cli_results.run_headline(run_dir)


@app.command()
def submit(
    config: ConfigArg,
    endpoint: Annotated[
        str, typer.Option(help="Globus Compute endpoint UUID (on the login node)", callback=_endpoint_id)
    ],
    repo_dir: Annotated[
        str | None, typer.Option(help="Pipeline checkout on the remote side (default: $PES2O_REPO there)")
    ] = None,
    dataset: DatasetOpt = None,
) -> None:
    """Start `run` on a remote login node through Globus Compute; prints the run id."""
    from executors.globus import compute_executor, submit_run
    from pipeline.config.loader import check_dataset_option

    try:  # what can be checked here, before signing in: its variables take the remote side's values
        check_dataset_option(config, dataset)
    except PipelineError as exc:
        _fail(exc)
    with _remote_errors(endpoint, "submit"), compute_executor(endpoint) as executor:
        record = submit_run(executor, config, repo_dir=repo_dir, dataset=dataset)
    out.print(f"started [bold]{record['run_id']}[/] on {record['host']} (pid {record['pid']})")
    out.print(f"run directory: {record['run_dir']}\nlog: {record['log']}")
    out.print(f"follow it with: python -m pipeline status --endpoint {endpoint} {record['run_dir']}")


@contextmanager
def _remote_errors(endpoint: str, command: str) -> Iterator[None]:
    """A remote function's error, or the Globus service's, ends the command with its message (exit 1)."""
    try:
        yield
    except (KeyboardInterrupt, typer.Exit):
        raise
    except Exception as exc:  # whatever the SDK or the remote side raised: its words, no traceback
        _error(f"{command} through endpoint {endpoint}: {type(exc).__name__}: {exc}", 1)


def _remote_status(endpoint: str, run: str, workdir: str | None, repo_dir: str | None) -> None:
    from executors.globus import compute_executor, remote_status
    from pipeline.runs import RunNotFound

    with _remote_errors(endpoint, "status"), compute_executor(endpoint) as executor:
        state = remote_status(executor, workdir, run, repo_dir=repo_dir)
    if state["status"] == "unknown" and state.get("error"):
        _error(f"status --endpoint {endpoint} {run}: {state['error']}", RunNotFound.exit_code)
    host = escape(str(state.get("host")))
    out.print(f"[bold]{escape(run)}[/]  status [bold]{state['status']}[/]  host {host}")
    table = Table("stage", "key", "cached", "tasks", "finished")
    for name, stage in (state.get("stages") or {}).items():
        table.add_row(
            name,
            str(stage.get("key")),
            "yes" if stage.get("cached") else "",
            str(stage.get("tasks", "")),
            "yes" if stage.get("finished") else "",
        )
    out.print(table)
    if state["status"] in UNSUCCESSFUL:
        raise typer.Exit(1)


@app.command()
def status(
    run_dir: Annotated[
        Path, typer.Argument(help="A run id (looked up under <workdir>/runs) or a run directory")
    ],
    endpoint: Annotated[
        str | None,
        typer.Option(
            help="Read the run on a remote login node through Globus Compute", callback=_endpoint_id
        ),
    ] = None,
    workdir: Annotated[
        str | None,
        typer.Option(
            help="Workdir whose runs/ holds the run ids (default: $PIPELINE_WORKDIR, else .; with "
            "--endpoint, a remote path, expanded there; by default a run submitted from the remote "
            "checkout is found by its id)"
        ),
    ] = None,
    repo_dir: Annotated[str | None, typer.Option(help="Remote pipeline checkout (with --endpoint)")] = None,
) -> None:
    """What a run did: status, stages, tasks, outputs."""
    from pipeline.runs import find_run

    if endpoint:
        _remote_status(endpoint, str(run_dir), workdir, repo_dir)
        return
    try:  # found as report and compare find it; a damaged provenance is an ArtifactError (exit 4)
        record = find_run(str(run_dir), Path(workdir) if workdir else None)
    except PipelineError as exc:
        _fail(exc)
    prov = record.provenance
    started = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(prov.started)) if prov.started is not None else "?"
    )
    lost = record.lost()
    shown = "lost" if lost else prov.status or "?"
    out.print(
        f"[bold]{escape(record.run_id)}[/]  status [bold]{escape(shown)}[/]  "
        f"started {started}  host {escape(prov.host or '?')}"
    )
    if lost:
        out.print(f"[red]lost:[/] {escape(lost)}; its provenance still says running")
    if prov.error:
        out.print(f"[red]error:[/] {escape(prov.error)}")
    table = Table("stage", "key", "cached", "tasks", "rows", "seconds", "output")
    order = ["shard", "chunk", "embed", "queries", "groundtruth"]
    stages = sorted(
        record.stages.values(), key=lambda s: order.index(s.name) if s.name in order else len(order)
    )
    problems: list[str] = []  # damaged files, named under the table
    points = _status_points(record)  # the vdb points' lines, and their row status when not all are whole
    for stage in stages:
        if stage.finished is None:  # a stage of a run that ended without finishing it was stopped
            seconds = "running" if shown == "running" else "stopped"
        else:
            seconds = f"{stage.finished - stage.started:.1f}" if stage.started is not None else "?"
        shown_status, _, damaged = _stage_status(stage.directory)
        if stage.name == "vdb" and points is not None and points.row and shown_status != "[red]damaged[/]":
            shown_status = points.row
        table.add_row(
            escape(stage.name),
            escape(stage.key),
            "yes" if stage.cached else "",
            str(stage.tasks),
            f"{stage.rows:,}" if stage.rows else "",
            seconds,
            shown_status,
        )
        problems += damaged
    out.print(table)
    if points is not None:
        for line in points.lines:
            out.print(line, markup=False, highlight=False, soft_wrap=True)
        problems += points.damage
    _damaged_lines(problems)
    if shown in UNSUCCESSFUL:  # a script can test a local run as it tests a remote one
        raise typer.Exit(1)


@dataclass
class _PointsStatus:
    """What ``status`` says of a run's vdb points."""

    lines: list[str]  # "vdb points: K of M finished", then a line per point
    damage: list[str]  # a point's file cut short or lost since: named under the table
    row: str | None  # the vdb row's status when not every point is whole (None: as its manifest says)


def _status_points(record: RunRecord) -> _PointsStatus | None:
    """The vdb points a run finished (measured, or done before), of how many it was to measure, each
    checked as ``plan`` checks it: what an interrupted run got to, and what its next run measures."""
    from pipeline.sweep import point_damage

    vdb = record.provenance.stages.get("vdb")
    if vdb is None:
        return None
    # As the run recorded them; a run that reused the whole stage recorded none: its manifest's.
    points = [(p, p.reused) for p in vdb.points or []] or [(p, True) for p in record.points if vdb.cached]
    planned = vdb.planned_points if vdb.planned_points is not None else (len(points) if vdb.cached else None)
    lines = [f"vdb points: {len(points)}" + (f" of {planned}" if planned is not None else "") + " finished"]
    damage, whole = [], 0
    for point, reused in points:
        directory = Path(point.directory)
        lost = point_damage(directory, point.key) if point.status == "succeeded" else []
        damage += [f"{line}: point {point.label} is measured again by the next run" for line in lost]
        whole += not lost
        state = "damaged" if lost else point.status + (" (done before)" if reused else "")
        lines.append(f"  {point.label}  repeat {point.repeat}  {state}  {directory}")
    total = planned if planned is not None else len(points)
    row = f"[yellow]partial[/] {whole}/{total}" if 0 < whole < total else None
    return _PointsStatus(lines, damage, row)


app.command()(cli_results.report)  # pipeline/cli/results.py
app.command()(cli_results.compare)


def main() -> None:
    """Console entry point."""
    stop_on_sigterm()  # `kill PID` stops a run as Ctrl-C does, with its cleanup
    try:
        app(prog_name="python -m pipeline")
    except SystemExit as exc:
        # typer ends every command on a KeyboardInterrupt with a silent 130; `run` says what stopped it
        # itself, and any other command stopped by SIGTERM (a job's walltime, `kill PID`) says so here
        # with the status a shell gives a process SIGTERM ended.
        if exc.code == 130 and _caused_by(exc, Terminated):
            console.print("[red]terminated[/] (SIGTERM)")
            raise SystemExit(143) from None
        raise


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``exc`` or an exception it was raised from or while handling is a ``kind``."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


if __name__ == "__main__":
    sys.exit(main())
