"""Parsl configuration for a generic Slurm site (partition, account, constraint, GPUs per node)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parsl.config import Config
from parsl.launchers import SrunLauncher
from parsl.providers import SlurmProvider

from executors import hpc
from executors.config import CpuWorkers, GpuWorkers, SlurmExecutorConfig


def slurm_provider(
    executor: SlurmExecutorConfig, block: GpuWorkers | CpuWorkers, gpus: bool
) -> SlurmProvider:
    """A SlurmProvider for one block; srun starts one manager per node."""
    return SlurmProvider(
        partition=block.queue or executor.partition,
        account=executor.account,
        qos=executor.qos,
        constraint=executor.constraint,
        nodes_per_block=block.nodes_per_block,
        cores_per_node=executor.cores_per_node,
        mem_per_node=executor.mem_per_node,
        gpus_per_node=executor.gpus_per_node if gpus else None,
        init_blocks=block.init_blocks,
        min_blocks=block.min_blocks,
        max_blocks=block.max_blocks,
        walltime=block.walltime or executor.walltime,
        scheduler_options="\n".join(executor.scheduler_options),
        worker_init=hpc.worker_init(executor.worker_init),
        exclusive=executor.exclusive,
        launcher=SrunLauncher(overrides=block.launcher_overrides),
    )


def slurm_config(
    executor: SlurmExecutorConfig, run_dir: Path, monitoring: Any = None, address: str | None = None
) -> Config:
    """Parsl Config for a Slurm site from ``executor``."""
    address = hpc.resolve_address(executor.interface, address)

    def common(block: Any) -> dict[str, Any]:
        # Workers drain before their own block's walltime ends, not the executor default's.
        return {
            "heartbeat_period": executor.heartbeat_period,
            "heartbeat_threshold": executor.heartbeat_threshold,
            "drain_period": hpc.drain_period(block.walltime or executor.walltime, executor.drain_margin_s),
        }

    executors = [
        hpc.gpu_executor(
            executor.gpu,
            slurm_provider(executor, executor.gpu, True),
            address,
            run_dir,
            **common(executor.gpu),
        )
    ]
    if executor.cpu is not None:
        provider = slurm_provider(executor, executor.cpu, False)
        executors.append(hpc.cpu_executor(executor.cpu, provider, address, run_dir, **common(executor.cpu)))
    executors.append(hpc.driver_executor(executor.driver_threads))
    return Config(
        executors=executors,
        retries=executor.retries,
        retry_handler=hpc.retry_handler,
        memoizer=hpc.memoizer(run_dir, executor.checkpoint_mode),
        run_dir=str(run_dir / "parsl"),
        monitoring=monitoring,
        initialize_logging=True,
        usage_tracking=0,
    )
