"""``python -m pipeline status <run>``: what a run did, here or on a remote login node (Globus Compute);
and how the commands show a stage output's state (``plan`` too)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from core.errors import ArtifactError, PipelineError
from pipeline.cli.output import error as _error
from pipeline.cli.output import fail as _fail
from pipeline.cli.output import out, warn

if TYPE_CHECKING:
    from pipeline.runs import RunRecord
    from pipeline.sweep import PointPlan

UNSUCCESSFUL = ("failed", "lost", "interrupted")  # `status` exits 1 for a run that ended so


def endpoint_id(endpoint: str | None) -> str | None:
    """A Globus Compute endpoint id is a UUID: anything else is refused before signing in to Globus."""
    if endpoint is not None:
        try:
            uuid.UUID(endpoint)
        except ValueError:
            raise typer.BadParameter(
                f"{endpoint!r} is not an endpoint id (a UUID, as `globus-compute-endpoint list` prints)"
            ) from None
    return endpoint


def stage_status(directory: Path, parts: Sequence[PointPlan] = ()) -> tuple[str, str, list[str]]:
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


def damaged_lines(damaged: list[str]) -> None:
    """Name what a run will redo and why (a file changed or cut short since it was written)."""
    for line in damaged:
        warn(line)


@contextmanager
def remote_errors(endpoint: str, command: str) -> Iterator[None]:
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

    with remote_errors(endpoint, "status"), compute_executor(endpoint) as executor:
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


def status(
    run_dir: Annotated[
        Path, typer.Argument(help="A run id (looked up under <workdir>/runs) or a run directory")
    ],
    endpoint: Annotated[
        str | None,
        typer.Option(help="Read the run on a remote login node through Globus Compute", callback=endpoint_id),
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
        shown_status, _, damaged = stage_status(stage.directory)
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
    damaged_lines(problems)
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
