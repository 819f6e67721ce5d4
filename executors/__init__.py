"""Parsl configurations, one small function per platform, chosen by ``executor.platform``."""

from __future__ import annotations

from pathlib import Path

from parsl.config import Config

from pipeline.config import RunConfig


def monitoring_hub(run_dir: Path):
    """Parsl's monitoring database in the run directory (``monitoring: true`` in the config)."""
    from parsl.monitoring import MonitoringHub

    return MonitoringHub(logging_endpoint=f"sqlite:///{run_dir / 'monitoring.db'}")


def cpu_label(config: RunConfig) -> str:
    """Executor label for CPU-bound tasks (sharding, chunking, database clients).

    HPC platforms may define a separate CPU block (label "cpu"); without one, CPU work shares the
    worker block (label "workers") that also runs the GPU stages.
    """
    from executors.local import WORKERS

    return "cpu" if getattr(config.executor, "cpu", None) is not None else WORKERS


def parsl_config_for(config: RunConfig, run_dir: Path) -> Config:
    """The Parsl ``Config`` for the run's platform."""
    monitoring = monitoring_hub(run_dir) if config.monitoring else None
    platform = config.executor.platform
    if platform == "local":
        from executors.local import local_config

        return local_config(config.executor, run_dir, monitoring)
    if platform == "polaris":
        from executors.polaris import polaris_config

        return polaris_config(config.executor, run_dir, monitoring)
    if platform == "aurora":
        from executors.aurora import aurora_config

        return aurora_config(config.executor, run_dir, monitoring)
    if platform == "slurm":
        from executors.slurm import slurm_config

        return slurm_config(config.executor, run_dir, monitoring)
    raise ValueError(f"no Parsl configuration for platform {platform!r}")
