"""Parsl configuration for ALCF Polaris (PBS Pro, 4 x A100 per node).

Follows ALCF's documented Polaris settings: one worker per GPU, ``block-reverse`` CPU affinity (GPU 0
sits next to the last cores), a single manager per node started by ``mpiexec --ppn 1`` owning all cores,
and the interchange reachable on the login node's ``bond0``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from parsl.config import Config
from parsl.launchers import MpiExecLauncher

from executors import hpc
from executors.config import CpuWorkers, GpuWorkers, PolarisExecutorConfig
from executors.providers import PbsConfig, pbs_provider


def mpiexec_launcher(block: GpuWorkers | CpuWorkers) -> MpiExecLauncher:
    """``mpiexec`` with the block's binding and overrides: one worker manager per node."""
    return MpiExecLauncher(bind_cmd=block.bind_cmd, overrides=block.launcher_overrides)


def pbs_config(
    executor: PbsConfig, run_dir: Path, monitoring: Any = None, address: str | None = None
) -> Config:
    """The Config shared by the PBS platforms: every block a PBS Pro job started by ``mpiexec``."""
    return hpc.hpc_config(
        executor, run_dir, monitoring, address, partial(pbs_provider, executor), mpiexec_launcher
    )


def polaris_config(
    executor: PolarisExecutorConfig, run_dir: Path, monitoring: Any = None, address: str | None = None
) -> Config:
    """Parsl Config for Polaris from ``executor`` (``address`` skips the interface lookup, for ``plan``)."""
    return pbs_config(executor, run_dir, monitoring, address)
