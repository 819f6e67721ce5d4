"""Parsl configuration for a generic Slurm site (partition, account, constraint, GPUs per node)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from parsl.config import Config
from parsl.launchers import SrunLauncher

from executors import hpc
from executors.config import CpuWorkers, GpuWorkers, SlurmExecutorConfig
from executors.providers import slurm_provider


def srun_launcher(block: GpuWorkers | CpuWorkers) -> SrunLauncher:
    """``srun`` with the block's overrides: one worker manager per node."""
    return SrunLauncher(overrides=block.launcher_overrides)


def slurm_config(
    executor: SlurmExecutorConfig, run_dir: Path, monitoring: Any = None, address: str | None = None
) -> Config:
    """Parsl Config for a Slurm site from ``executor``: every block a Slurm job started by ``srun``."""
    return hpc.hpc_config(
        executor, run_dir, monitoring, address, partial(slurm_provider, executor), srun_launcher
    )
