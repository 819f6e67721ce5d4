"""One run from a loaded configuration: run directory, logging, plan, DAG, provenance."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from rich.console import Console

from core.errors import PipelineError
from pipeline.config_loader import LoadedConfig
from pipeline.plan import Plan, build_plan
from pipeline.provenance import Provenance, create_run_dir

log = logging.getLogger("pipeline")


def _log_to(run_dir: Path) -> logging.Handler:
    handler = logging.FileHandler(run_dir / "pipeline.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def run(loaded: LoadedConfig, console: Console | None = None) -> Path:
    """Run the workflow for ``loaded``; return the run directory. Raises PipelineError on failure.

    A configuration whose every stage is already complete starts no Parsl executor at all.
    """
    console = console or Console(stderr=True)
    plan: Plan = build_plan(loaded)
    run_dir = create_run_dir(loaded)
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
        provenance.status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        provenance.error = f"{type(exc).__name__}: {exc}"
        log.exception("run failed")
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


def _manifest(directory: Path):
    from core.store import read_manifest

    return read_manifest(directory)


__all__ = ["PipelineError", "run"]
