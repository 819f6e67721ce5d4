"""Building blocks shared by the batch-scheduled platforms (Polaris, Aurora, Slurm sites).

Each platform module assembles a ``parsl.Config`` from these: the GPU executor (label ``workers``), an
optional CPU executor (label ``cpu``), the in-process ``driver`` threads, a retry handler that retries only
tasks whose worker or node was lost, and a memoizer that checkpoints finished apps for resume.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from parsl.dataflow.memoization import BasicMemoizer
from parsl.executors import HighThroughputExecutor, ThreadPoolExecutor
from parsl.executors.high_throughput.errors import ManagerLost, WorkerLost
from parsl.utils import get_all_checkpoints

from core.errors import PipelineError
from executors.config import CpuWorkers, GpuWorkers, walltime_seconds
from executors.labels import CPU, DRIVER, WORKERS

# Failures of the infrastructure, not of the task: the same task succeeds on another worker.
RETRYABLE = (ManagerLost, WorkerLost)
# Cost that exhausts any retry budget at once.
NO_RETRY = float("inf")


def retry_handler(exception: BaseException, task_record: Any) -> float:
    """Parsl retry cost: lost workers/nodes cost 1 retry; bad input and bugs are not retried.

    A PipelineError (bad configuration, corrupt input, a database that lost rows) fails the same way on
    every worker, so retrying only burns allocation; neither is an ordinary exception from the task code.
    """
    if isinstance(exception, PipelineError):
        return NO_RETRY
    if isinstance(exception, RETRYABLE):
        return 1.0
    return NO_RETRY


def memoizer(run_dir: Path, checkpoint_mode: str | None) -> BasicMemoizer:
    """Parsl 2026 memoization: checkpoints of earlier runs in the same workdir are loaded for resume.

    Apps declared with ``cache=True`` return a checkpointed result instead of running again; the
    content-keyed stage directories remain the primary resume mechanism.
    """
    files: list[str] = []
    if checkpoint_mode is not None:
        runs = run_dir.parent
        for parsl_dir in sorted(runs.glob("*/parsl")) if runs.is_dir() else []:
            if parsl_dir.parent != run_dir:
                files.extend(get_all_checkpoints(str(parsl_dir)))
    return BasicMemoizer(memoize=True, checkpoint_mode=checkpoint_mode, checkpoint_files=files)


def worker_init(lines: list[str]) -> str:
    """Shell run on each node before the worker pool: the site's lines, then this venv first on PATH."""
    bin_dir = Path(sys.executable).parent
    return "\n".join(
        [
            *lines,
            f'export PATH="{bin_dir}:$PATH"',
            "export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false",
        ]
    )


def drain_period(walltime: str, margin_s: int | None) -> int | None:
    """Seconds after which workers stop taking tasks, so none is killed mid-task by the walltime."""
    if margin_s is None:
        return None
    return max(60, walltime_seconds(walltime) - margin_s)


def gpu_executor(block: GpuWorkers, provider: Any, address: str | None, run_dir: Path, **common: Any):
    """The GPU HighThroughputExecutor: one worker per accelerator, pinned cores, no prefetch."""
    accelerators = block.accelerator_ids
    return HighThroughputExecutor(
        label=WORKERS,
        address=address,
        available_accelerators=accelerators,
        max_workers_per_node=len(accelerators),
        cores_per_worker=block.cores_per_worker,
        cpu_affinity=block.cpu_affinity,
        prefetch_capacity=block.prefetch_capacity,
        provider=provider,
        worker_logdir_root=str(run_dir / "parsl"),
        **common,
    )


def cpu_executor(block: CpuWorkers, provider: Any, address: str | None, run_dir: Path, **common: Any):
    """The CPU HighThroughputExecutor for chunking and database clients."""
    return HighThroughputExecutor(
        label=CPU,
        address=address,
        max_workers_per_node=block.workers_per_node,
        cores_per_worker=block.cores_per_worker,
        cpu_affinity=block.cpu_affinity,
        prefetch_capacity=0,
        provider=provider,
        worker_logdir_root=str(run_dir / "parsl"),
        **common,
    )


def driver_executor(threads: int) -> ThreadPoolExecutor:
    """In-process threads for bookkeeping tasks and the database pilot (runs on the login node)."""
    return ThreadPoolExecutor(label=DRIVER, max_threads=threads)


def resolve_address(interface: str | None, address: str | None = None) -> str | None:
    """The login node's address on ``interface`` (None: let Parsl try every address).

    ``address`` overrides the lookup (``plan`` renders configs on machines without that interface).
    """
    if address is not None or interface is None:
        return address
    from parsl.addresses import address_by_interface

    return address_by_interface(interface)


def pbs_scheduler_options(filesystems: list[str], place: str | None, extra: list[str]) -> str:
    """#PBS directive lines: file systems the job needs, placement, then the user's lines."""
    lines = []
    if filesystems:
        lines.append(f"#PBS -l filesystems={':'.join(filesystems)}")
    if place:
        lines.append(f"#PBS -l place={place}")
    return "\n".join([*lines, *extra])
