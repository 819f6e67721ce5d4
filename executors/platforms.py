"""The one dispatcher from ``executor.platform`` to that platform's Parsl ``Config``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parsl.config import Config

from executors.config import ExecutorConfig
from executors.labels import CPU, WORKERS


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


def parsl_config_for(
    executor: ExecutorConfig, run_dir: Path, monitoring: bool = False, address: str | None = None
) -> Config:
    """The Parsl ``Config`` for ``executor.platform``; ``address`` overrides the login node's (HPC)."""
    hub = monitoring_hub(run_dir) if monitoring else None
    if executor.platform == "local":
        from executors.local import local_config

        return local_config(executor, run_dir, hub)
    if executor.platform == "polaris":
        from executors.polaris import polaris_config as build
    elif executor.platform == "aurora":
        from executors.aurora import aurora_config as build
    elif executor.platform == "slurm":
        from executors.slurm import slurm_config as build
    else:
        raise ValueError(f"no Parsl configuration for platform {executor.platform!r}")
    return build(executor, run_dir, hub, address)
