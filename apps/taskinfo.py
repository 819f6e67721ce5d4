"""Where and when a task ran, and on what arithmetic: recorded in every shard record for provenance."""

from __future__ import annotations

import functools
import os
import platform
import socket
import time
from pathlib import Path
from typing import Any

# CPU features that change what a numeric kernel computes or which one runs: SIMD widths, FMA, and the
# bf16/fp16/int8 units (a bf16 embedding runs bf16 only where the CPU has them).
NUMERIC_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
    "asimd", "sve", "sve2", "bf16", "i8mm",
)  # fmt: skip


@functools.cache
def cpu_info() -> dict[str, Any]:
    """This host's CPU: model, machine, and which of :data:`NUMERIC_FLAGS` it has (Linux; else empty)."""
    model, flags = platform.processor() or None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model") and model in (None, "", platform.machine()):
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {
        "model": model,
        "machine": platform.machine(),
        "numeric_flags": [flag for flag in NUMERIC_FLAGS if flag in flags],
    }


def numeric_libraries() -> list[dict[str, Any]]:
    """The BLAS and OpenMP libraries loaded in this process, with the kernel each runs (threadpoolctl)."""
    import threadpoolctl

    keys = ("internal_api", "version", "architecture", "num_threads")
    return [
        {"library": Path(info.get("filepath", "")).name, **{k: info.get(k) for k in keys}}
        for info in threadpoolctl.threadpool_info()
    ]


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
        "cpu": cpu_info(),
    }
