"""torch matrix products as the candidate search of the exact top-k: the path for a GPU (cuda, xpu).

Each block of base vectors is moved to the device; float32 matrix products (TF32 and other reduced
precisions off for the duration) give each query's ``k + margin`` nearest rows, and
:class:`apps.dataset.groundtruth.exact_search.ExactSearch` decides the top-k and its order in float64 on the
CPU, exactly as on the FAISS path: both paths give the same ids and distances to the bit.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from apps.dataset.groundtruth.exact_search import ExactSearch


def block_rows(n_queries: int, dim: int, memory_budget_mb: int) -> int:
    """Base rows per block so distances, the top-k's temporaries and the block itself fit the budget."""
    per_row = n_queries * (4 + 8 + 8) + dim * 4 * 2  # distances, topk values + indices; block (+normalised)
    return max(256, int(memory_budget_mb * 2**20 // per_row))


@contextlib.contextmanager
def full_float32() -> Iterator[None]:
    """float32 matrix products in full IEEE float32 for the duration (no TF32 or bf16 shortcuts on CUDA or
    oneDNN), as the error bound assumes; the caller's settings are restored. Set once, on the calling
    thread, around a block (the settings are process-wide)."""
    import torch

    # torch >= 2.9 has per-backend settings, which the legacy call would contradict; older ones only that.
    backends = [
        b
        for b in (
            torch.backends.cuda.matmul,
            getattr(getattr(torch.backends, "mkldnn", None), "matmul", None),
        )
        if b is not None and hasattr(b, "fp32_precision")
    ]
    if not backends:
        saved_legacy = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(saved_legacy)
        return
    saved = [b.fp32_precision for b in backends]
    for b in backends:
        b.fp32_precision = "ieee"
    try:
        yield
    finally:
        for b, value in zip(backends, saved, strict=True):
            b.fp32_precision = value


class TorchKernel:
    """torch's float32 matrix products and ``topk`` on one block, on ``device``."""

    name = "torch"

    def __init__(self, queries: np.ndarray, metric: str, device: str) -> None:
        import torch

        self.torch, self.metric, self.device = torch, metric, device
        q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(device)
        if metric == "cosine":
            q = torch.nn.functional.normalize(q, dim=1)
        self.q = q
        self.q_sqnorm = (q * q).sum(dim=1, keepdim=True)

    def prepare(self, block: np.ndarray) -> Any:
        """The block on the device (normalised for cosine) and its squared norms (for l2)."""
        torch = self.torch
        x = torch.from_numpy(block).to(self.device)
        if self.metric == "cosine":
            x = torch.nn.functional.normalize(x, dim=1)
        return x, (x * x).sum(dim=1) if self.metric == "l2" else None

    def block_context(self) -> contextlib.AbstractContextManager[None]:
        """Full float32 matrix products around a block's calls (see :func:`full_float32`)."""
        return full_float32()

    def knn(self, queries: np.ndarray, prepared: Any, kk: int) -> tuple[np.ndarray, np.ndarray]:
        """torch's top-``kk`` of query rows ``queries``: (inner products or squared L2, rows)."""
        torch = self.torch
        x, x_sqnorm = prepared
        index = torch.from_numpy(np.asarray(queries, dtype=np.int64)).to(self.device)
        q = self.q.index_select(0, index)
        products = q @ x.T  # under block_context: full float32
        if self.metric == "l2":
            # ‖q‖² − 2 q·x + ‖x‖², as FAISS's BLAS path computes it; the tiny negatives of cancellation
            # are clamped, which only brings a value nearer the exact one.
            values = (self.q_sqnorm.index_select(0, index) - 2.0 * products + x_sqnorm).clamp_(min=0.0)
            raw, rows = torch.topk(values, kk, dim=1, largest=False, sorted=True)
        else:
            raw, rows = torch.topk(products, kk, dim=1, largest=True, sorted=True)
        return raw.float().cpu().numpy(), rows.cpu().numpy().astype(np.int64)


class TorchExactSearch(ExactSearch):
    """:class:`apps.dataset.groundtruth.exact_search.ExactSearch` with torch proposing the candidates on
    ``device``.

    On an accelerator the float64 re-scoring on the host is most of the work, so the queries are split
    into one slice per host thread (``threads``: by default torch's on an accelerator, one on the CPU),
    each proposed and re-scored on its own thread.
    """

    def __init__(
        self, queries: np.ndarray, k: int, metric: str, device: str = "cpu", threads: int | None = None
    ) -> None:
        import torch

        n = len(queries)
        if threads is None:  # on the CPU torch's matrix products already use every thread
            threads = 1 if device == "cpu" else torch.get_num_threads()
        parallel = max(1, min(threads, n // 16))
        bounds = np.linspace(0, n, parallel + 1).astype(int)
        slices = [slice(int(lo), int(hi)) for lo, hi in itertools.pairwise(bounds)]
        super().__init__(queries, k, metric, TorchKernel(queries, metric, device), slices, parallel)
