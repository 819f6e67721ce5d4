"""Parsl configurations, one small function per platform, chosen by ``executor.platform``."""

from __future__ import annotations

from pathlib import Path

from parsl.config import Config

from pipeline.config import RunConfig


def monitoring_hub(run_dir: Path):
    """Parsl's monitoring database in the run directory (``monitoring: true`` in the config)."""
    from parsl.monitoring import MonitoringHub

    return MonitoringHub(hub_address="127.0.0.1", logging_endpoint=f"sqlite:///{run_dir / 'monitoring.db'}")


def parsl_config_for(config: RunConfig, run_dir: Path) -> Config:
    """The Parsl ``Config`` for the run's platform."""
    monitoring = monitoring_hub(run_dir) if config.monitoring else None
    platform = config.executor.platform
    if platform == "local":
        from executors.local import local_config

        return local_config(config.executor, run_dir, monitoring)
    raise ValueError(f"no Parsl configuration for platform {platform!r}")
