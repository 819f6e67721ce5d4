"""Which device a worker computes on: the one rule the embedding and the ground-truth stages share."""

from __future__ import annotations

import os
from typing import Any

from core.errors import PipelineError

# What Parsl's worker pool sets to pin a worker to one accelerator, by the backend that reads it.
PINNING = {"cuda": "CUDA_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK"}


def pick_device(preference: str = "auto") -> str:
    """``preference`` as given, or for ``auto`` the accelerator the worker's environment exposes (Parsl
    sets CUDA_VISIBLE_DEVICES / ZE_AFFINITY_MASK): CUDA, then Intel XPU, else the CPU.

    A worker pinned to one accelerator must see exactly one (:func:`check_one_device`)."""
    if preference != "auto":
        return preference
    import torch  # only when asked: an OpenVINO or FAISS worker may run without it

    for backend in ("cuda", "xpu"):
        if accelerator_available(backend):
            check_one_device(backend, getattr(torch, backend).device_count())
            return backend
    return "cpu"


def accelerator_available(backend: str) -> bool:
    """Whether torch can use a ``cuda`` or ``xpu`` device in this process (a torch without the backend:
    no)."""
    import torch

    module = getattr(torch, backend, None)
    return module is not None and module.is_available()


def check_one_device(backend: str, visible: int, env: Any = None) -> None:
    """Fail when a worker pinned to one accelerator (a single id in its pinning variable) sees another
    number of devices: on Aurora, tile ids such as ``5.1`` under ``ZE_FLAT_DEVICE_HIERARCHY=FLAT`` pin
    nothing or the wrong tile, and every worker would share one GPU."""
    env = os.environ if env is None else env
    variable = PINNING[backend]
    pinned = env.get(variable)
    if pinned is None or "," in pinned or visible == 1:
        return
    hierarchy = env.get("ZE_FLAT_DEVICE_HIERARCHY")
    hint = (
        f" with ZE_FLAT_DEVICE_HIERARCHY={hierarchy}; tile ids need COMPOSITE (executors/hpc.py sets it)"
        if backend == "xpu" and hierarchy != "COMPOSITE"
        else ""
    )
    raise PipelineError(
        f"this worker is pinned to accelerator {pinned!r} ({variable}) but sees {visible} {backend} "
        f"devices{hint}"
    )
