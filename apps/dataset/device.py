"""Which device a worker computes on: the one rule the embedding and the ground-truth stages share."""

from __future__ import annotations


def pick_device(preference: str = "auto") -> str:
    """``preference`` as given, or for ``auto`` the accelerator the worker's environment exposes (Parsl
    sets CUDA_VISIBLE_DEVICES / ZE_AFFINITY_MASK): CUDA, then Intel XPU, else the CPU."""
    if preference != "auto":
        return preference
    import torch  # only when asked: an OpenVINO or FAISS worker may run without it

    if torch.cuda.is_available():
        return "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    return "cpu"
