"""Parsl configuration for one machine: a laptop, a CI runner, or an interactive node."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from parsl.config import Config
from parsl.executors import HighThroughputExecutor, ThreadPoolExecutor
from parsl.launchers import SingleNodeLauncher

from core.lifetime import pool_watchdog_shell
from executors.config import LocalExecutorConfig
from executors.labels import DRIVER, WORKERS
from executors.providers import JobRequest, local_provider, worker_init


def local_config(executor: LocalExecutorConfig, run_dir: Path, monitoring=None) -> Config:
    """HighThroughputExecutor with LocalProvider on loopback, ``executor.workers`` worker processes."""
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # One block, started with the run and kept until it ends. The pool sits in its own process group:
    # a watchdog started in it stops the group when this driver dies, even by SIGKILL.
    block = JobRequest(
        nodes=1,
        worker_init=worker_init([pool_watchdog_shell(run_dir / "pool-watchdog.log")], sep="; "),
        launcher=SingleNodeLauncher(),
        init_blocks=1,
        min_blocks=1,
        max_blocks=1,
    )
    return Config(
        executors=[
            HighThroughputExecutor(
                label=WORKERS,
                address=executor.address,
                loopback_address=executor.address,
                max_workers_per_node=executor.workers,
                cores_per_worker=1e-6,  # the worker count is set explicitly above
                prefetch_capacity=0,
                provider=local_provider(block),
                worker_logdir_root=str(run_dir / "parsl"),
            ),
            ThreadPoolExecutor(label=DRIVER, max_threads=2),
        ],
        run_dir=str(run_dir / "parsl"),
        monitoring=monitoring,
        initialize_logging=True,
        usage_tracking=0,
    )
