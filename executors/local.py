"""Parsl configuration for one machine: a laptop, a CI runner, or an interactive node."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from parsl.config import Config
from parsl.executors import HighThroughputExecutor, ThreadPoolExecutor
from parsl.providers import LocalProvider

from executors.config import LocalExecutorConfig
from executors.labels import DRIVER, WORKERS


def worker_init() -> str:
    """Shell lines run before the worker pool starts: this interpreter's bin/ first on PATH.

    Parsl starts ``process_worker_pool.py`` and ``interchange.py`` from PATH, so the virtual environment
    running the pipeline must be found first, whatever the user's shell had.
    """
    bin_dir = Path(sys.executable).parent
    return f'export PATH="{bin_dir}:$PATH"; export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false'


def local_config(executor: LocalExecutorConfig, run_dir: Path, monitoring=None) -> Config:
    """HighThroughputExecutor with LocalProvider on loopback, ``executor.workers`` worker processes."""
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return Config(
        executors=[
            HighThroughputExecutor(
                label=WORKERS,
                address=executor.address,
                loopback_address=executor.address,
                max_workers_per_node=executor.workers,
                cores_per_worker=1e-6,  # the worker count is set explicitly above
                prefetch_capacity=0,
                provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1, worker_init=worker_init()),
                worker_logdir_root=str(run_dir / "parsl"),
            ),
            ThreadPoolExecutor(label=DRIVER, max_threads=2),
        ],
        run_dir=str(run_dir / "parsl"),
        monitoring=monitoring,
        initialize_logging=True,
        usage_tracking=0,
    )
