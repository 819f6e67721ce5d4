"""Parsl configuration for ALCF Polaris (PBS Pro, 4 x A100 per node).

Follows ALCF's documented Polaris settings: one worker per GPU, ``block-reverse`` CPU affinity (GPU 0
sits next to the last cores), a single manager per node started by ``mpiexec --ppn 1`` owning all cores,
and the interchange reachable on the login node's ``bond0``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parsl.config import Config
from parsl.launchers import MpiExecLauncher
from parsl.providers import PBSProProvider

from executors import hpc
from executors.config import AuroraExecutorConfig, CpuWorkers, GpuWorkers, PolarisExecutorConfig

PbsConfig = PolarisExecutorConfig | AuroraExecutorConfig


def pbs_provider(
    executor: PbsConfig,
    block: GpuWorkers | CpuWorkers,
    nodes: int,
    select_options: str | None = None,
) -> PBSProProvider:
    """A PBSProProvider for one block: account, queue, select, file systems, walltime, worker_init."""
    return PBSProProvider(
        account=executor.account,
        queue=block.queue or executor.queue,
        select_options=select_options if select_options is not None else executor.select_options,
        scheduler_options=hpc.pbs_scheduler_options(
            executor.filesystems, executor.place, executor.scheduler_options
        ),
        worker_init=hpc.worker_init(executor.worker_init),
        nodes_per_block=nodes,
        cpus_per_node=executor.cpus_per_node,
        init_blocks=block.init_blocks,
        min_blocks=block.min_blocks,
        max_blocks=block.max_blocks,
        walltime=block.walltime or executor.walltime,
        launcher=MpiExecLauncher(bind_cmd=block.bind_cmd, overrides=block.launcher_overrides),
    )


def pbs_config(
    executor: PbsConfig, run_dir: Path, monitoring: Any = None, address: str | None = None
) -> Config:
    """The Config shared by the PBS platforms: GPU workers, optional CPU workers, driver threads."""
    address = hpc.resolve_address(executor.interface, address)

    def common(block: Any) -> dict[str, Any]:
        # Workers drain before their own block's walltime ends, not the executor default's.
        return {
            "heartbeat_period": executor.heartbeat_period,
            "heartbeat_threshold": executor.heartbeat_threshold,
            "drain_period": hpc.drain_period(block.walltime or executor.walltime, executor.drain_margin_s),
        }

    gpu = executor.gpu
    executors = [
        hpc.gpu_executor(
            gpu,
            pbs_provider(executor, gpu, gpu.nodes_per_block, gpu.select_options),
            address,
            run_dir,
            **common(gpu),
        )
    ]
    if executor.cpu is not None:
        cpu = executor.cpu
        provider = pbs_provider(executor, cpu, cpu.nodes_per_block, cpu.select_options)
        executors.append(hpc.cpu_executor(cpu, provider, address, run_dir, **common(cpu)))
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


def polaris_config(
    executor: PolarisExecutorConfig, run_dir: Path, monitoring: Any = None, address: str | None = None
) -> Config:
    """Parsl Config for Polaris from ``executor`` (``address`` skips the interface lookup, for ``plan``)."""
    return pbs_config(executor, run_dir, monitoring, address)
