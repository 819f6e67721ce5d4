"""Exact top-k with torch matrix products, streamed block by block: the path for a GPU (cuda, xpu).

Distances come from torch matrix products over blocks of base vectors sized to a memory budget; the
running top-k is merged block by block, so memory does not depend on the dataset size. Ties are broken by
(distance, position in the dataset), which is (distance, id) because ids ascend along the dataset. To make
that exact, each distance is packed with the position into one int64 whose order is (distance, position):
``topk`` over it never sees two equal keys.
"""

from __future__ import annotations

import numpy as np

_POSITION_BITS = 32  # positions up to 4.29e9 vectors


def _sortable(distances):
    """float32 tensor -> int64 tensor with the same order (the IEEE-754 sign trick; -0.0 as +0.0)."""
    import torch

    bits = (distances + 0.0).contiguous().view(torch.int32).to(torch.int64)
    return torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


def _unsortable(keys):
    """Inverse of :func:`_sortable` for the high half of a packed key -> float32 tensor."""
    import torch

    bits = torch.where(keys >= 0, keys, keys ^ 0x7FFFFFFF).to(torch.int32)
    return bits.view(torch.float32)


def block_rows(n_queries: int, dim: int, memory_budget_mb: int) -> int:
    """Base rows per block so distances, packed keys and the block itself fit the budget."""
    per_row = n_queries * (4 + 8 + 8) + dim * 4 * 2  # float dist, int64 key, topk temp; vectors (+normalised)
    return max(256, int(memory_budget_mb * 2**20 // per_row))


class ExactSearch:
    """Running exact top-k of a fixed query set over base vectors fed block by block (torch)."""

    def __init__(self, queries: np.ndarray, k: int, metric: str, device: str = "cpu") -> None:
        import torch

        self.torch = torch
        self.k, self.metric, self.device = k, metric, device
        q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(device)
        if metric == "cosine":
            q = torch.nn.functional.normalize(q, dim=1)
        self.q = q
        self.q_sqnorm = (q * q).sum(dim=1, keepdim=True)
        n = q.shape[0]
        self.best_keys = torch.full((n, 0), 0, dtype=torch.int64, device=device)
        self.best_ids = torch.full((n, 0), 0, dtype=torch.int64, device=device)
        self.position = 0

    def _distances(self, x):
        torch = self.torch
        if self.metric == "cosine":
            x = torch.nn.functional.normalize(x, dim=1)
            return 1.0 - self.q @ x.T
        if self.metric == "ip":
            return -(self.q @ x.T)
        # Clamp the tiny negatives that cancellation produces. Ranked as reported (L2, not squared), so
        # equal reported distances are in id order, as on the FAISS path.
        return (self.q_sqnorm - 2.0 * (self.q @ x.T) + (x * x).sum(dim=1)).clamp_(min=0.0).sqrt_()

    def add(self, ids: np.ndarray, vectors: np.ndarray, owned: bool = False) -> None:
        """Fold one block of base vectors (and their ids, ascending along the stream) into the top-k."""
        torch = self.torch
        if len(ids) == 0:
            return
        x = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).to(self.device)
        block_ids = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(self.device)
        distances = self._distances(x).float()
        positions = torch.arange(
            self.position, self.position + len(ids), device=self.device, dtype=torch.int64
        )
        self.position += len(ids)
        if self.position >= 1 << _POSITION_BITS:
            raise ValueError("more than 2**32 base vectors: widen the packed position")
        keys = (_sortable(distances) << _POSITION_BITS) | positions  # (Q, B), all distinct
        take = min(self.k, keys.shape[1])
        block_keys, idx = torch.topk(keys, take, dim=1, largest=False, sorted=False)
        merged_keys = torch.cat([self.best_keys, block_keys], dim=1)
        merged_ids = torch.cat([self.best_ids, block_ids[idx]], dim=1)
        take = min(self.k, merged_keys.shape[1])
        self.best_keys, order = torch.topk(merged_keys, take, dim=1, largest=False, sorted=True)
        self.best_ids = torch.gather(merged_ids, 1, order)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(neighbour ids (Q, k) int64, distances (Q, k) float32), nearest first.

        Distances are 1 - cosine, -inner product, or L2.
        """
        distances = _unsortable(self.best_keys >> _POSITION_BITS)
        return self.best_ids.cpu().numpy(), distances.cpu().numpy()
