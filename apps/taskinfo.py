"""Where and when a task ran: recorded in every shard record for provenance."""

from __future__ import annotations

import os
import socket
import time
from typing import Any


def task_context(started: float) -> dict[str, Any]:
    """Start/end times, host, pid and the Parsl worker/block ids of the running task."""
    finished = time.time()
    return {
        "started": started,
        "finished": finished,
        "seconds": round(finished - started, 6),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "parsl_worker": os.environ.get("PARSL_WORKER_RANK"),
        "parsl_block": os.environ.get("PARSL_WORKER_BLOCK_ID"),
        "parsl_pool": os.environ.get("PARSL_WORKER_POOL_ID"),
    }
