"""Parsl configuration for ALCF Aurora (PBS Pro, 6 Intel GPUs x 2 tiles, 104 cores per node).

Same shape as Polaris; the differences live in the config model's defaults and the YAML file: twelve
workers per node, one per tile ('0.0' .. '5.1', pinned through ``ZE_AFFINITY_MASK`` by Parsl), ALCF's
per-tile core lists that skip the reserved cores 0 and 52, ``mpiexec --ppn 1``, file system ``flare``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parsl.config import Config

from executors.config import AuroraExecutorConfig
from executors.polaris import pbs_config


def aurora_config(
    executor: AuroraExecutorConfig, run_dir: Path, monitoring: Any = None, address: str | None = None
) -> Config:
    """Parsl Config for Aurora from ``executor`` (``address`` skips the interface lookup, for ``plan``)."""
    return pbs_config(executor, run_dir, monitoring, address)
