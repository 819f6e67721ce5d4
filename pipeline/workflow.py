"""One run from a loaded configuration: run directory, logging, plan, DAG, provenance."""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from core.errors import PipelineError, describe
from core.lifetime import STATE_DIR, WorkdirLock, record_group, stop_leftovers, stop_run_groups
from core.store import os_error_reason
from core.watchdog import REGISTRY_VAR, RUN_VAR
from pipeline.config.loader import LoadedConfig
from pipeline.plan import Plan, build_plan
from pipeline.progress import warn
from pipeline.provenance import Provenance, create_run_dir

log = logging.getLogger("pipeline")


def _log_to(run_dir: Path) -> logging.Handler:
    handler = logging.FileHandler(run_dir / "pipeline.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


@contextmanager
def _own_workdir(loaded: LoadedConfig, workdir: Path, console: Console) -> Iterator[WorkdirLock]:
    """Hold the workdir's lock for the run; stop what dead runs left running before anything starts."""
    try:
        lock = WorkdirLock.acquire(workdir)  # a second run in the same workdir stops here
    except OSError as exc:  # a workdir under a file, no permission: name the config's workdir line
        reason = os_error_reason(exc, workdir / STATE_DIR)
        raise loaded.error_at(("workdir",), f"cannot create the run lock in {workdir}: {reason}") from None
    try:
        stopped = stop_leftovers(workdir)
        if stopped:
            console.print(f"stopped {len(stopped)} leftover(s) of an earlier run (processes, batch jobs):")
            for line in stopped:
                console.print(f"  {escape(line)}", highlight=False)
            # info: before the run's log file exists, a warning would reach stderr a second time
            log.info("stopped leftovers of earlier runs: %s", stopped)
        yield lock
    finally:
        lock.release()


@contextmanager
def _run_environment(workdir: Path, run_id: str) -> Iterator[None]:
    """Mark every process the run starts with its id and record the driver; stop what is left at the end."""
    saved = {name: os.environ.get(name) for name in (RUN_VAR, REGISTRY_VAR)}
    os.environ[RUN_VAR] = run_id  # inherited by the worker pool, its workers and the servers
    os.environ[REGISTRY_VAR] = str(workdir / STATE_DIR / "processes")
    record = record_group("driver", os.getpid(), None)
    try:
        yield
    finally:
        stop_run_groups(workdir, run_id)  # a pool or server that outlived its shutdown
        if record is not None:
            record.unlink(missing_ok=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run(loaded: LoadedConfig, console: Console | None = None) -> Path:
    """Run the workflow for ``loaded``; return the run directory. Raises PipelineError on failure.

    A configuration whose every stage is already complete starts no Parsl executor at all. The run
    holds ``<workdir>/.run/lock`` throughout: a second run in the same workdir exits with a message.
    """
    console = console or Console(stderr=True)
    try:
        plan: Plan = build_plan(loaded)
    except PipelineError:
        raise
    except Exception as exc:  # no run directory (nor its pipeline.log) exists yet: say so in the line
        raise PipelineError(f"planning the run failed before it started: {describe(exc)}") from exc
    for line in plan.resources.warnings if plan.resources else []:
        warn(console, line)
    for line in damaged_outputs(plan):
        warn(console, line)
    workdir = loaded.config.workdir_path
    with _own_workdir(loaded, workdir, console) as lock:
        run_dir = create_run_dir(loaded)
        lock.note(run_dir.name)
        if plan.model_dir is not None:
            _keep_model_digest(plan.model_dir, workdir)
        with _run_environment(workdir, run_dir.name):
            return _run(loaded, plan, run_dir, console)


def _keep_model_digest(model_dir: Path, workdir: Path) -> None:
    """Keep the model files' sha256 the plan computed in the workdir: later plans read it instead of
    hashing gigabytes of weights again (the plan itself makes no folder)."""
    from apps.dataset.embedding.loading import model_digest, model_digest_dir

    with suppress(OSError):  # only a cache: without it the next plan hashes again
        model_digest_dir(workdir).mkdir(parents=True, exist_ok=True)
        model_digest(model_dir, model_digest_dir(workdir))  # hashed already in this process: written only


def _run(loaded: LoadedConfig, plan: Plan, run_dir: Path, console: Console) -> Path:
    """The run itself, inside the workdir's lock."""
    handler = _log_to(run_dir)
    provenance = Provenance(run_dir, loaded)
    provenance.save()
    console.print(f"run [bold]{run_dir.name}[/] -> {run_dir}")
    started = time.monotonic()
    try:
        if plan.complete:
            console.print("every stage is complete already: nothing to execute")
            for name, stage in plan.stages.items():
                provenance.stage_started(name, stage.key, stage.directory, stage.upstream, cached=True)
                provenance.stage_finished(name, _manifest(stage.directory))
            outputs = {name: str(stage.directory) for name, stage in plan.stages.items()}
        else:
            from pipeline.dag import execute  # imports Parsl only when there is work

            outputs = execute(plan, provenance, console)
        provenance.outputs = outputs
        provenance.status = "succeeded"
    except BaseException as exc:
        log.exception("run failed")
        # A library's own words for a full disk become what happened, in the record as on the console.
        full = disk_full_error(plan, exc) if isinstance(exc, Exception) else None
        provenance.status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        provenance.error = _stopped_by(full or exc)
        if full is not None:
            raise full from exc
        raise
    finally:
        provenance.save()
        logging.getLogger().removeHandler(handler)
        handler.close()
    log.info("run %s finished in %.1fs", run_dir.name, time.monotonic() - started)
    console.print(
        f"[green]done[/] in {time.monotonic() - started:.1f}s; provenance: {run_dir / 'provenance.json'}"
    )
    for name, directory in provenance.outputs.items():
        console.print(f"  {name:<12} {directory}")
    return run_dir


def damaged_outputs(plan: Plan) -> list[str]:
    """A line per shard or database point that was finished but no longer verifies (cut short,
    removed, its manifest damaged): the run makes it again, and says why."""
    from core.store import shard_progress

    shards = [
        f"{line}: made again"
        for stage in plan.stages.values()
        if not stage.parts and stage.directory.is_dir() and not stage.complete
        for line in shard_progress(stage.directory)[1]
    ]
    points = [
        f"{line}: point {point.number} {point.label} is measured again"
        for point in plan.points
        for line in point.damage()
    ]
    return shards + points


def _stopped_by(exc: BaseException) -> str:
    """What ended a run, for its provenance: a signal in words, an error as ``Type: message``."""
    from core.lifetime import Terminated

    if isinstance(exc, Terminated):
        return "terminated (SIGTERM)"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    return describe(exc)


# Below this much free space, a failed write whose library does not say ENOSPC is taken as the disk
# filling up (a C++ library's full disk reads "basic_ios::clear: iostream error"). Measured after the
# failure, when the failed write's temporary files are gone again: so "nearly full", not "0 free".
FULL_DISK_BYTES = 64 * 2**20
# The words of a write that failed without an errno: only such an error is blamed on a nearly full disk.
WRITE_FAILURE_WORDS = ("iostream error", "i/o error", "input/output error", "write", "no space", "disk")


def disk_full_error(plan: Plan, exc: BaseException) -> PipelineError | None:
    """When ``exc`` is a write that failed because the store's disk filled up: the error to report
    instead (where, how much is free, what the run keeps there); None otherwise. Complete stages stay
    complete."""
    from core.format import size
    from pipeline.dag import root_cause
    from pipeline.resources import disk_usage

    if isinstance(exc, PipelineError):
        return None  # already says what happened
    cause = root_cause(exc) if not isinstance(exc, OSError) else exc
    enospc = isinstance(cause, OSError) and cause.errno == errno.ENOSPC
    usage = disk_usage(plan.store)
    looks_like_a_write = any(word in str(cause).lower() for word in WRITE_FAILURE_WORDS)
    if not enospc and not (looks_like_a_write and usage.free <= FULL_DISK_BYTES):
        return None
    estimates = [e.node_disk for _, e in (plan.resources.estimates if plan.resources else []) if e]
    need = f", and up to {size(max(estimates))} of database data per point" if estimates else ""
    return PipelineError(
        f"the disk holding {plan.store.parent} ran out of space ({size(usage.free)} free now of "
        f"{size(usage.total)}). The run writes its model cache, dataset and ground truth there{need} (the "
        f"resource plan's estimate). The run stopped with {describe(cause)}. Free space there, or set "
        "workdir on a larger disk, and run again: complete stages are kept, nothing half-written is taken "
        "as complete"
    )


def _manifest(directory: Path):
    from core.store import read_manifest

    return read_manifest(directory)


__all__ = ["PipelineError", "run"]
