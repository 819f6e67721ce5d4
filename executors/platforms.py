"""The platforms as one table, and the one dispatcher from ``executor.platform`` to its Parsl ``Config``.

Every batch platform builds the same Config (:func:`executors.hpc.hpc_config`); what differs is which
scheduler submits its blocks and how a block starts one worker manager per node: :data:`PLATFORMS`. The
site facts (cores, GPUs, file systems, interfaces) are the defaults of each platform's model in
:mod:`executors.config`; the YAML file may override them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from parsl.config import Config
from parsl.launchers import MpiExecLauncher, SrunLauncher
from parsl.launchers.base import Launcher

from executors import hpc
from executors.allocation import NodeSplit, in_one_allocation, restrict_to
from executors.config import CpuWorkers, ExecutorConfig, GpuWorkers
from executors.labels import CPU, WORKERS
from executors.providers import JobRequest, local_provider, pbs_provider, slurm_provider


def monitoring_hub(run_dir: Path) -> Any:
    """Parsl's monitoring database in the run directory (``monitoring: true`` in the config)."""
    from parsl.monitoring import MonitoringHub

    return MonitoringHub(logging_endpoint=f"sqlite:///{run_dir / 'monitoring.db'}")


def cpu_label(executor: ExecutorConfig) -> str:
    """Executor label for CPU-bound tasks (sharding, chunking, database clients).

    HPC platforms may define a separate CPU block (label "cpu"); without one, CPU work shares the
    worker block (label "workers") that also runs the GPU stages.
    """
    return CPU if getattr(executor, "cpu", None) is not None else WORKERS


def mpiexec_launcher(block: GpuWorkers | CpuWorkers) -> MpiExecLauncher:
    """``mpiexec`` with the block's binding and overrides: one worker manager per node."""
    return MpiExecLauncher(bind_cmd=block.bind_cmd, overrides=block.launcher_overrides)


def srun_launcher(block: GpuWorkers | CpuWorkers) -> SrunLauncher:
    """``srun`` with the block's overrides: one worker manager per node."""
    return SrunLauncher(overrides=block.launcher_overrides)


@dataclass(frozen=True)
class Platform:
    """A batch platform: the scheduler that submits its blocks and the launcher that starts them."""

    description: str
    provider: Callable[[Any, JobRequest], Any]  # (executor config, block request) -> Parsl provider
    launcher: Callable[[GpuWorkers | CpuWorkers], Launcher]  # one worker manager per node of a block


PLATFORMS: dict[str, Platform] = {
    # Follows ALCF's documented Polaris settings: one worker per GPU, ALCF's core list per GPU (GPU 0 sits
    # next to the last cores), a single manager per node started by ``mpiexec --ppn 1`` owning all cores,
    # and the interchange reachable on the login node's ``bond0`` (Parsl's parsl/configs/polaris.py).
    "polaris": Platform("ALCF Polaris (PBS Pro, 4 x A100 per node)", pbs_provider, mpiexec_launcher),
    # Same shape as Polaris; the differences live in the config model's defaults and the YAML file: twelve
    # workers per node, one per tile ('0.0' .. '5.1', pinned through ``ZE_AFFINITY_MASK`` by Parsl), ALCF's
    # per-tile core lists that skip the reserved cores 0 and 52, ``mpiexec --ppn 1``, file system ``flare``.
    "aurora": Platform(
        "ALCF Aurora (PBS Pro, 6 Intel GPUs x 2 tiles, 104 cores per node)", pbs_provider, mpiexec_launcher
    ),
    # Partition, account, constraint and GPUs per node come from the YAML file.
    "slurm": Platform("a generic Slurm site", slurm_provider, srun_launcher),
}


def parsl_config_for(
    executor: ExecutorConfig,
    run_dir: Path,
    monitoring: bool = False,
    address: str | None = None,
    split: NodeSplit | None = None,
    gpu_on_demand: bool = False,
) -> Config:
    """The Parsl ``Config`` for ``executor.platform``; ``address`` overrides the login node's (HPC);
    ``split``: the job's nodes by role under ``executor.allocation: one``; ``gpu_on_demand``: the GPU
    block is not started with the run (``init_blocks`` 0) but when a task first needs it."""
    hub = monitoring_hub(run_dir) if monitoring else None
    if executor.platform == "local":
        from executors.local import local_config

        return local_config(executor, run_dir, hub)
    if gpu_on_demand and executor.gpu.init_blocks:
        executor = executor.model_copy(update={"gpu": executor.gpu.model_copy(update={"init_blocks": 0})})
    platform = PLATFORMS.get(executor.platform)
    if platform is None:
        raise ValueError(f"no Parsl configuration for platform {executor.platform!r}")
    if in_one_allocation(executor):
        if split is None:
            raise ValueError("allocation one needs the job's nodes (executors.allocation.current_split)")
        return _in_one_allocation(executor, run_dir, hub, address, platform, split)
    provider = partial(platform.provider, executor)
    return hpc.hpc_config(executor, run_dir, hub, address, provider, platform.launcher)


def _in_one_allocation(
    executor: Any, run_dir: Path, hub: Any, address: str | None, platform: Platform, split: NodeSplit
) -> Config:
    """Blocks started inside the job by a LocalProvider, each launcher kept on its role's nodes."""
    roles = {"gpu": split.gpu, "cpu": split.cpu}

    def launcher(block: GpuWorkers | CpuWorkers) -> Launcher:
        role = "gpu" if block is executor.gpu else "cpu"
        _, options = restrict_to(executor.platform, role, roles[role], run_dir)
        overrides = " ".join(o for o in (options, block.launcher_overrides) if o)
        return platform.launcher(block.model_copy(update={"launcher_overrides": overrides}))

    def provider(request: JobRequest) -> Any:
        role = "gpu" if request.gpus else "cpu"
        init, _ = restrict_to(executor.platform, role, roles[role], run_dir)
        lines = [request.worker_init, init] if init else [request.worker_init]
        return local_provider(replace(request, nodes=len(roles[role]), worker_init="\n".join(lines)))

    return hpc.hpc_config(executor, run_dir, hub, address, provider, launcher)
