"""The run as one batch job (``executor.allocation: one``, :mod:`executors.allocation`).

``python -m pipeline run`` on a login node submits this job and waits for it; inside the job (the
scheduler's node list is set) the same command runs the DAG with every role on its share of the nodes.
``plan`` shows the job's script as ``job-allocation.sh`` (:func:`pipeline.hpc_plan.render_artifacts`).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from core.errors import PipelineError
from pipeline.config.loader import LoadedConfig

JOB_NAME = "pes2o-run"
# ${NAME} in the config file: the variables the job must see as the login node saw them (PBS does not
# pass the submitting environment on; Slurm does, and the exports are then the same values).
_CONFIG_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


def inside_a_job(env: Any = None) -> bool:
    """True inside a batch job (Slurm's or PBS's node list is set): ``run`` runs the DAG here."""
    env = os.environ if env is None else env
    return bool(env.get("SLURM_JOB_NODELIST") or env.get("PBS_NODEFILE"))


def job_directory(loaded: LoadedConfig) -> Path:
    """Where the job's script and its scheduler output go: ``<workdir>/runs/allocation``."""
    return loaded.config.runs_dir / "allocation"


def allocation_job(loaded: LoadedConfig) -> tuple[Any, str]:
    """(provider, command) of the job: the platform's directives for every role's nodes, then ``python
    -m pipeline run`` on its first node, from this directory, with the variables the config reads."""
    from parsl.launchers import SimpleLauncher

    from executors.allocation import nodes_needed
    from executors.providers import JobRequest, provider_for, worker_init

    cfg = loaded.config
    names = dict.fromkeys(_CONFIG_VARIABLE.findall(loaded.path.read_text()))
    exports = [f"export {n}={shlex.quote(os.environ[n])}" for n in names if n in os.environ]
    request = JobRequest(
        nodes=sum(nodes_needed(cfg.executor, cfg.vdb)),
        worker_init=worker_init([*exports, *cfg.executor.worker_init]),
        launcher=SimpleLauncher(),  # the driver runs once, on the first node; it launches the rest
        walltime=cfg.executor.walltime,
    )
    command = (
        f"cd {shlex.quote(str(Path.cwd()))} && exec {shlex.quote(sys.executable)} -m pipeline run "
        + shlex.quote(str(loaded.path.resolve()))
    )
    if loaded.dataset_entry:  # the file's datasets entry this run is (a name checked by the loader)
        command += f" --dataset {shlex.quote(loaded.dataset_entry)}"
    return provider_for(cfg.executor, request), command


def submit_and_wait(loaded: LoadedConfig, console: Console, poll_s: float = 10.0) -> str:
    """Submit the job, say where its output goes, wait for it to end; return its job id.

    Interrupted here (Ctrl-C), the job is cancelled: whatever a run starts dies with it. A job that
    ends other than COMPLETED raises, with the tail of its error output.
    """
    from executors.providers import describe_job

    provider, command = allocation_job(loaded)
    directory = job_directory(loaded)
    directory.mkdir(parents=True, exist_ok=True)
    provider.script_dir = str(directory)
    job_id = provider.submit(command, 1, JOB_NAME)
    if not job_id:
        raise PipelineError("the scheduler did not accept the allocation job")
    console.print(f"submitted the run as one job: [bold]{job_id}[/] ({directory}); waiting for it to end")
    state = None
    try:
        while True:
            status = provider.status([job_id])[0]
            if status.terminal:  # how it ended: the scheduler's word below, not Parsl's guess
                break
            if status.state.name != state:
                state = status.state.name
                console.print(f"job {job_id}: {state}")
            time.sleep(poll_s)
    except KeyboardInterrupt:
        provider.cancel([job_id])
        console.print(f"[red]interrupted[/]: job {job_id} cancelled")
        raise
    ended = describe_job(provider, str(job_id)) or state
    outputs = sorted(directory.glob(f"{JOB_NAME}*.std*"), key=lambda p: p.stat().st_mtime)[-2:]
    if not str(ended).startswith("COMPLETED") and not str(ended).startswith("F, exit 0"):
        from apps.vdb.process import tail

        shown = "\n".join(f"--- {p}\n{tail(p, 20)}" for p in outputs)
        raise PipelineError(f"allocation job {job_id} ended ({ended})\n{shown}".rstrip())
    stdout = [p for p in outputs if p.suffix == ".stdout"]
    if stdout:  # the driver's own console output ends with the run's headline table
        from apps.vdb.process import tail

        console.print(tail(stdout[0], 25), markup=False, highlight=False)
    console.print(f"job {job_id} ended ({ended}); its output: {', '.join(str(p) for p in outputs)}")
    return str(job_id)
