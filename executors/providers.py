"""Parsl providers, one function per scheduler: PBS Pro (Polaris, Aurora), Slurm, and this machine.

The platforms' worker blocks (:mod:`executors.hpc`, :mod:`executors.local`) and the database pilot's job
(:mod:`apps.vdb.cluster.provider`) describe what they need as a :class:`JobRequest`; the platform's account,
queue, file systems and directive lines come from its executor config. :func:`worker_init` is the one place
that puts this interpreter's virtual environment first on the workers' PATH.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parsl.launchers.base import Launcher
from parsl.providers import LocalProvider, PBSProProvider, SlurmProvider

from executors.config import AuroraExecutorConfig, PolarisExecutorConfig, SlurmExecutorConfig

PbsConfig = PolarisExecutorConfig | AuroraExecutorConfig


@dataclass(frozen=True)
class JobRequest:
    """One kind of batch job: what it asks for beyond the platform's account, queue and directives."""

    nodes: int
    worker_init: str  # shell run on the job before its command
    launcher: Launcher  # how the command starts on the job's nodes
    init_blocks: int = 0
    min_blocks: int = 0
    max_blocks: int = 1
    queue: str | None = None  # None: the platform's queue (PBS) or partition (Slurm)
    walltime: str | None = None  # None: the platform's walltime
    select_options: str | None = None  # PBS; None: the platform's
    filesystems: tuple[str, ...] = ()  # PBS: file systems needed beyond the platform's
    scheduler_options: tuple[str, ...] = ()  # directive lines after the platform's
    gpus: bool = True  # Slurm: ask for the platform's GPUs per node
    cores_and_memory: bool = True  # Slurm: ask for the platform's cores and memory per node

    @property
    def scaling(self) -> dict[str, int]:
        """Parsl's block counts: submitted at start, kept when idle, at most."""
        return {"init_blocks": self.init_blocks, "min_blocks": self.min_blocks, "max_blocks": self.max_blocks}


def worker_init(site_lines: Sequence[str] = (), sep: str = "\n") -> str:
    """Shell run before a worker pool starts: the site's lines, then this interpreter's bin/ first on PATH.

    Parsl starts ``process_worker_pool.py`` and ``interchange.py`` from PATH, so the virtual environment
    running the pipeline must be found first, whatever the user's shell had; models load offline.
    """
    bin_dir = Path(sys.executable).parent
    return sep.join(
        [
            *site_lines,
            f'export PATH="{bin_dir}:$PATH"',
            "export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false",
        ]
    )


def pbs_scheduler_options(filesystems: list[str], place: str | None, extra: list[str]) -> str:
    """#PBS directive lines: file systems the job needs, placement, then the user's lines."""
    lines = []
    if filesystems:
        lines.append(f"#PBS -l filesystems={':'.join(filesystems)}")
    if place:
        lines.append(f"#PBS -l place={place}")
    return "\n".join([*lines, *extra])


def rerunnable(executor: Any, queue: str | None) -> bool:
    """True when jobs in ``queue`` (None: the platform's) may be preempted, so they are submitted
    rerunnable (``#PBS -r y``) and keep their data where a rerun finds it."""
    queue = queue or getattr(executor, "queue", None)
    return queue in getattr(executor, "preemptable_queues", ())


def pbs_provider(executor: PbsConfig, request: JobRequest) -> PBSProProvider:
    """A PBSProProvider: the platform's account, queue, select, file systems, walltime (unless overridden)."""
    select = request.select_options
    queue = request.queue or executor.queue
    rerun = ["#PBS -r y"] if rerunnable(executor, queue) else []
    return PBSProProvider(
        account=executor.account,
        queue=queue,
        select_options=select if select is not None else executor.select_options,
        scheduler_options=pbs_scheduler_options(
            [*executor.filesystems, *request.filesystems],
            executor.place,
            [*executor.scheduler_options, *rerun, *request.scheduler_options],
        ),
        worker_init=request.worker_init,
        nodes_per_block=request.nodes,
        cpus_per_node=executor.cpus_per_node,
        **request.scaling,
        walltime=request.walltime or executor.walltime,
        launcher=request.launcher,
    )


def slurm_provider(executor: SlurmExecutorConfig, request: JobRequest) -> SlurmProvider:
    """A SlurmProvider: the platform's partition, account, QoS, constraint and walltime unless overridden."""
    return SlurmProvider(
        partition=request.queue or executor.partition,
        account=executor.account,
        qos=executor.qos,
        constraint=executor.constraint,
        nodes_per_block=request.nodes,
        cores_per_node=executor.cores_per_node if request.cores_and_memory else None,
        mem_per_node=executor.mem_per_node if request.cores_and_memory else None,
        gpus_per_node=executor.gpus_per_node if request.gpus else None,
        **request.scaling,
        walltime=request.walltime or executor.walltime,
        scheduler_options="\n".join([*executor.scheduler_options, *request.scheduler_options]),
        worker_init=request.worker_init,
        exclusive=executor.exclusive,
        launcher=request.launcher,
    )


def local_provider(request: JobRequest) -> LocalProvider:
    """A LocalProvider: the job runs on this machine (one node; the scheduler fields do not apply)."""
    return LocalProvider(
        nodes_per_block=request.nodes,  # inside one allocation a block spans its share of the job's nodes
        **request.scaling,
        worker_init=request.worker_init,
        launcher=request.launcher,
    )


def provider_for(executor: Any, request: JobRequest) -> PBSProProvider | SlurmProvider | LocalProvider:
    """The provider that submits ``request`` on ``executor.platform``'s scheduler."""
    if executor.platform in ("polaris", "aurora"):
        return pbs_provider(executor, request)
    if executor.platform == "slurm":
        return slurm_provider(executor, request)
    if executor.platform == "local":
        return local_provider(request)
    raise ValueError(f"no Parsl provider for platform {executor.platform!r}")


def cancel_command(provider: Any) -> list[str] | None:
    """The command that cancels one of ``provider``'s jobs (the id appended), None for this machine."""
    if isinstance(provider, SlurmProvider):
        return ["scancel"]
    if isinstance(provider, PBSProProvider):
        return ["qdel"]
    return None


# How Slurm (JobState) and PBS (job_state) name a job that has ended or is ending.
ENDED_STATES = frozenset(
    {"CANCELLED", "COMPLETED", "COMPLETING", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED"}
    | {"OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "F", "E", "X"}
)


def job_ended(description: str) -> bool:
    """True when a :func:`describe_job` text names an ended (or ending) job."""
    return description.split(",")[0].strip() in ENDED_STATES


def describe_job(provider: Any, job_id: str) -> str | None:
    """How the scheduler says a job ended ('TIMEOUT', 'CANCELLED', 'F exit 271'), None when it cannot tell.

    Parsl's status falls back to squeue without Slurm accounting and then calls every vanished job
    COMPLETED; ``scontrol`` (and ``qstat -x`` on PBS) still knows why for a while.
    """
    if isinstance(provider, SlurmProvider):
        command = ["scontrol", "show", "job", "-o", job_id]
    elif isinstance(provider, PBSProProvider):
        command = ["qstat", "-x", "-f", job_id]
    else:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    fields = dict(re.findall(r"(\w+)\s*=\s*(\S+)", done.stdout)) if done.returncode == 0 else {}
    if "JobState" in fields:
        reason, state = fields.get("Reason", "None"), fields["JobState"]
        if state == "COMPLETING" and reason == "TimeLimit":
            state = "TIMEOUT"  # Slurm shows COMPLETING while it ends a job past its time limit
        return state + (f", reason {reason}" if reason not in ("None", "(null)") else "")
    if "job_state" in fields:
        return fields["job_state"] + (f", exit {fields['Exit_status']}" if "Exit_status" in fields else "")
    return None
