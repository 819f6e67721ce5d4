"""Building blocks shared by the batch-scheduled platforms (Polaris, Aurora, Slurm sites).

:func:`hpc_config` assembles a platform's ``parsl.Config`` from these, given the platform's provider and
launcher: the GPU executor (label ``workers``), an optional CPU executor (label ``cpu``), the in-process
``driver`` threads, a retry handler that retries only tasks whose worker or node was lost, and Parsl's
memoizer (no app is cached: resume comes from the content-keyed stage directories).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parsl.config import Config
from parsl.dataflow.memoization import BasicMemoizer
from parsl.executors import HighThroughputExecutor, ThreadPoolExecutor
from parsl.executors.high_throughput.errors import ManagerLost, WorkerLost
from parsl.launchers.base import Launcher
from parsl.utils import get_all_checkpoints

from core.errors import PipelineError
from executors.allocation import job_walltime
from executors.config import (
    AuroraExecutorConfig,
    CpuWorkers,
    GpuWorkers,
    PolarisExecutorConfig,
    SlurmExecutorConfig,
    drain_period,
)
from executors.labels import CPU, DRIVER, WORKERS
from executors.providers import JobRequest, worker_init

HpcConfig = PolarisExecutorConfig | AuroraExecutorConfig | SlurmExecutorConfig

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
    """Parsl's BasicMemoizer, with the checkpoint files of earlier runs in the same workdir loaded.

    Resume does not rely on it: no app of the pipeline is declared ``cache=True``, so Parsl memoizes
    nothing and writes no checkpoint entries. A re-run skips work through the content-keyed stage
    directories instead (a stage whose manifest verifies is not submitted; a finished shard's record
    returns at once). The memoizer is kept so that an app given ``cache=True`` later resumes from
    checkpoints without further wiring.
    """
    files: list[str] = []
    if checkpoint_mode is not None:
        runs = run_dir.parent
        for parsl_dir in sorted(runs.glob("*/parsl")) if runs.is_dir() else []:
            if parsl_dir.parent != run_dir:
                files.extend(get_all_checkpoints(str(parsl_dir)))
    return BasicMemoizer(memoize=True, checkpoint_mode=checkpoint_mode, checkpoint_files=files)


def gpu_executor(block: GpuWorkers, provider: Any, address: str | None, run_dir: Path, **common: Any):
    """The GPU HighThroughputExecutor: one worker per accelerator, pinned cores, no prefetch.

    A node without accelerators (``accelerators: 0``, the local Slurm testbed) runs one worker per node.
    """
    accelerators = block.accelerator_ids
    return HighThroughputExecutor(
        label=WORKERS,
        address=address,
        available_accelerators=accelerators,
        max_workers_per_node=len(accelerators) or 1,
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


def block_environment(platform: str, block: GpuWorkers | CpuWorkers) -> list[str]:
    """Lines the sites' documentation asks of a block, run after the site's own ``worker_init``."""
    lines = []
    if platform in ("polaris", "aurora") and block.nodes_per_block == 1:
        # Parsl's AF_UNIX socket path under a one-node job's TMPDIR is too long for the kernel; ALCF's
        # fix: argonne-lcf/user-guides docs/polaris/workflows/parsl.md and docs/aurora/workflows/parsl.md.
        lines.append("export TMPDIR=/tmp")
    if isinstance(block, GpuWorkers) and any("." in a for a in block.accelerator_ids):
        # Accelerators named as tiles ('0.0' .. '5.1', Parsl's ZE_AFFINITY_MASK) need the composite
        # hierarchy; Aurora's frameworks module sets FLAT (tiles as devices 0..11), under which '5.1'
        # names no device: argonne-lcf/user-guides docs/aurora/data-science/frameworks/pytorch.md.
        lines.append("export ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE")
    return lines


def resolve_address(interface: str | None, address: str | None = None) -> str | None:
    """The login node's address on ``interface`` (None: let Parsl try every address).

    ``address`` overrides the lookup (``plan`` renders configs on machines without that interface).
    """
    if address is not None or interface is None:
        return address
    from parsl.addresses import address_by_interface

    return address_by_interface(interface)


def hpc_config(
    executor: HpcConfig,
    run_dir: Path,
    monitoring: Any,
    address: str | None,
    provider: Callable[[JobRequest], Any],
    launcher: Callable[[GpuWorkers | CpuWorkers], Launcher],
) -> Config:
    """The Config every batch platform shares: GPU workers, optional CPU workers, driver threads.

    ``provider`` submits a block's :class:`JobRequest` to the platform's scheduler; ``launcher`` starts one
    worker manager per node of a block (``mpiexec --ppn 1`` on PBS, ``srun`` on Slurm).
    """
    # Parsl starts interchange.py from the driver's PATH: this interpreter's environment first.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    address = resolve_address(executor.interface, address)

    def htex_args(block: GpuWorkers | CpuWorkers, gpus: bool) -> dict[str, Any]:
        init = worker_init([*executor.worker_init, *block_environment(executor.platform, block)])
        request = JobRequest(
            nodes=block.nodes_per_block,
            worker_init=init,
            launcher=launcher(block),
            init_blocks=block.init_blocks,
            min_blocks=block.min_blocks,
            max_blocks=block.max_blocks,
            queue=block.queue,
            walltime=block.walltime,
            select_options=block.select_options,
            gpus=gpus,
        )
        return {
            "provider": provider(request),
            "address": address,
            "run_dir": run_dir,
            "heartbeat_period": executor.heartbeat_period,
            "heartbeat_threshold": executor.heartbeat_threshold,
            # Workers drain before their own job's walltime ends: their block's, or under allocation one
            # the one job's (a block's own walltime does not apply inside it).
            "drain_period": drain_period(job_walltime(executor, block), executor.drain_margin_s),
        }

    executors = [gpu_executor(executor.gpu, **htex_args(executor.gpu, True))]
    if executor.cpu is not None:
        executors.append(cpu_executor(executor.cpu, **htex_args(executor.cpu, False)))
    executors.append(driver_executor(executor.driver_threads))
    return Config(
        executors=executors,
        retries=executor.retries,
        retry_handler=retry_handler,
        memoizer=memoizer(run_dir, executor.checkpoint_mode),
        run_dir=str(run_dir / "parsl"),
        monitoring=monitoring,
        initialize_logging=True,
        usage_tracking=0,
    )
