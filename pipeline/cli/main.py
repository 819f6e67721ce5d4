"""``python -m pipeline validate|plan|run|status|submit|report|compare|dataset``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from core.errors import PipelineError, os_message
from core.lifetime import Terminated, stop_on_sigterm
from pipeline.cli import results as cli_results
from pipeline.cli import status as cli_status
from pipeline.cli.dataset import app as dataset_app
from pipeline.cli.output import console, out, warn
from pipeline.cli.output import error as _error
from pipeline.cli.output import fail as _fail
from pipeline.cli.status import damaged_lines, endpoint_id, remote_errors, stage_status
from pipeline.config import variants
from pipeline.config.loader import LoadedConfig, dataset_entries, load_config

if TYPE_CHECKING:
    from pipeline.plan import Plan

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Pes2o-VE pipeline: corpus -> embedding dataset -> vector-database benchmarks, with provenance.",
)
app.add_typer(dataset_app, name="dataset")
ConfigArg = Annotated[Path, typer.Argument(help="YAML run configuration")]
QUEUE_LIMITS_VAR = "PES2O_QUEUE_LIMITS"  # sets --queue-limits (a site's login shell, a CI job)


def _queue_limits_mode(ctx: typer.Context, value: str) -> str:
    """``--queue-limits`` checked as it is parsed, a bad value named as the user gave it: the option, or
    the variable that set it."""
    from executors.queues import check_mode

    # By name: typer 0.29 parses with its own copy of Click, whose ParameterSource is not click's.
    source = ctx.get_parameter_source("queue_limits")
    from_env = getattr(source, "name", None) == "ENVIRONMENT"
    try:
        check_mode(value, QUEUE_LIMITS_VAR if from_env else "--queue-limits")
    except PipelineError as exc:
        _fail(exc)
    return value


QueueLimitsOpt = Annotated[
    str,
    typer.Option(
        "--queue-limits",
        envvar=QUEUE_LIMITS_VAR,
        callback=_queue_limits_mode,
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
        with use_queue_limits(mode, listing):  # type: ignore[arg-type]  # checked as the option is parsed
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
        status, shards, damaged = stage_status(stage.directory, stage.parts)
        problems += damaged
        shown = name if stage.name == name else f"{name} ({stage.name})"  # embed (import): the dataset's role
        table.add_row(shown, stage.key, status, shards, str(stage.directory))
    from pipeline.headline import print_table

    print_table(out, table)  # whole: the directories are what a user copies from it
    damaged_lines(problems)
    if the_plan.points:
        from pipeline.sweep import describe, sweep_cost

        lines = describe(the_plan.points)  # plain lines: labels hold brackets, and must not be cut
        out.print(f"vdb points ({len(lines)}, run in this order, one at a time):")
        for number, label, repeat, params, key, done in lines:
            state = "done" if done else "to run"
            text = f"  {number:>3}  {label}  repeat {repeat}  key {key}  {state}\n       {params}"
            out.print(text, markup=False, highlight=False, soft_wrap=True)
        damaged_lines(
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
        str, typer.Option(help="Globus Compute endpoint UUID (on the login node)", callback=endpoint_id)
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
    with remote_errors(endpoint, "submit"), compute_executor(endpoint) as executor:
        record = submit_run(executor, config, repo_dir=repo_dir, dataset=dataset)
    out.print(f"started [bold]{record['run_id']}[/] on {record['host']} (pid {record['pid']})")
    out.print(f"run directory: {record['run_dir']}\nlog: {record['log']}")
    out.print(f"follow it with: python -m pipeline status --endpoint {endpoint} {record['run_dir']}")


app.command()(cli_status.status)  # pipeline/cli/status.py
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
