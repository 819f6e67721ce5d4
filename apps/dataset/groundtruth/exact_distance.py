"""Exact distances: float64, summed in a fixed order, so every machine computes the same bits.

The ground truth, the mixed workload's checkpoint truth, the import check of published neighbours and
recall's recomputed distances all rank vectors by these values, never by a BLAS or SIMD kernel's:

* every product of two float32 (or float16, uint8) components is exact in float64 (24 + 24 significant
  bits fit in 53), and never subnormal;
* the D products of a pair are added in one fixed pairwise tree (:func:`fixed_order_sum`), one IEEE-754
  operation at a time, so the rounding does not depend on the CPU's SIMD width, the BLAS kernel, the
  thread count or where a vector falls in a block;
* hence bitwise-identical vectors get bitwise-identical distances, and a tie is a real tie, broken by id.

"Exact" therefore means: the top-k under these float64 distances, ties (equal float64 values) by id.
Two vectors whose true distances differ by less than about ``D × 2⁻⁵³`` relative may be ordered either
way, but the same way on every machine.

A float32 kernel (FAISS, torch) only proposes candidates. :func:`float32_error` bounds how far its
distance can be from the exact one, whatever its summation order, so a search can tell when a vector it
did not propose might still belong to the top-k (see :mod:`apps.dataset.groundtruth.exact_search`).
"""

from __future__ import annotations

import numpy as np

VERSION = "float64-pairwise-1"  # in the content keys and cache tags of everything ranked by these values
METRICS = ("cosine", "ip", "l2")
_UNIT_ROUNDOFF = 2.0**-24  # float32
_SAFETY = 1.01  # covers the float64 rounding of the exact side (about 2⁻²⁹ of the float32 bound)
_SMALLEST_NORMAL = 2.0**-126  # float32


# Two distances are a tie within max(TIE_RTOL x |d|, TIE_ATOL): float32 vectors, distances recomputed in
# float64 (the absolute part covers zero distances: duplicate rows). The recall's rule and the import's
# check of published ground truth are this one.
TIE_RTOL = 1e-5
TIE_ATOL = 1e-6


def tie_tolerance(distance: np.ndarray | float) -> np.ndarray:
    """How far a distance may be from ``distance`` and still tie with it."""
    return np.maximum(TIE_RTOL * np.abs(distance), TIE_ATOL)


def _tree_sum(buffer: np.ndarray) -> np.ndarray:
    """Sum a float64 buffer (D, ...) over its *first* axis, in place, in one fixed pairwise order.

    Each step adds the upper half onto the lower half elementwise; an odd last row moves down to be added
    in a later step. The order depends only on D. (The summed axis first keeps every addition on
    contiguous memory: about twice as fast as halving the last axis.)
    """
    width = buffer.shape[0]
    while width > 1:
        half = width // 2
        np.add(buffer[:half], buffer[half : 2 * half], out=buffer[:half])
        if width % 2:
            buffer[half] = buffer[width - 1]
        width = half + width % 2
    return buffer[0].copy()


def fixed_order_sum(values: np.ndarray) -> np.ndarray:
    """Sum over the last axis in one fixed pairwise order: IEEE-754 additions, one rounding each, in an
    order that depends only on the length of the axis (not on the CPU, the SIMD width or a BLAS)."""
    a = np.asarray(values, dtype=np.float64)
    if a.shape[-1] == 0:
        return np.zeros(a.shape[:-1], np.float64)
    return _tree_sum(np.moveaxis(a, -1, 0).copy())  # a copy: summed in place


def _combine_sum(x: np.ndarray, y: np.ndarray, op: np.ufunc) -> np.ndarray:
    """Fixed-order sum over the last axis of ``op(x, y)`` (broadcast), computed in float64.

    ``dtype=float64`` makes the ufunc convert its float32 inputs and run the float64 loop: a float32 loop
    would round each product to float32 before the output is widened.
    """
    shape = np.broadcast_shapes(np.shape(x), np.shape(y))
    if shape[-1] == 0:
        return np.zeros(shape[:-1], np.float64)
    buffer = np.empty((shape[-1], *shape[:-1]), np.float64)
    op(np.moveaxis(np.asarray(x), -1, 0), np.moveaxis(np.asarray(y), -1, 0), out=buffer, dtype=np.float64)
    if op is np.subtract:
        np.multiply(buffer, buffer, out=buffer)
    return _tree_sum(buffer)


def squared_norms(vectors: np.ndarray) -> np.ndarray:
    """Fixed-order float64 squared norms of ``vectors`` (..., D) -> (...)."""
    return _combine_sum(vectors, vectors, np.multiply)


def ranking_values(
    queries: np.ndarray,
    vectors: np.ndarray,
    metric: str,
    query_sq: np.ndarray | None = None,
    vector_sq: np.ndarray | None = None,
) -> np.ndarray:
    """Exact values the search ranks by (smaller is nearer): 1 − cos, −ip, or the *squared* L2 distance.

    ``queries`` (..., D) broadcast against ``vectors`` (..., D) -> (...). A zero vector has cosine 0.
    Cosine may be given the squared norms (:func:`squared_norms`) of either side, computed once.
    """
    if metric == "l2":
        return _combine_sum(vectors, queries, np.subtract)
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    dot = _combine_sum(queries, vectors, np.multiply)
    if metric == "ip":
        return -dot
    qq = squared_norms(queries) if query_sq is None else query_sq
    xx = squared_norms(vectors) if vector_sq is None else vector_sq
    norms = np.sqrt(qq) * np.sqrt(xx)
    return 1.0 - np.divide(dot, norms, out=np.zeros_like(dot), where=norms > 0)


def reported(values: np.ndarray, metric: str) -> np.ndarray:
    """Ranking values -> the distances a ground truth stores: L2 as the root of the squared distance."""
    values = np.asarray(values, dtype=np.float64)
    return np.sqrt(np.maximum(values, 0.0)) if metric == "l2" else values


def exact_distances(queries: np.ndarray, vectors: np.ndarray, metric: str) -> np.ndarray:
    """Exact float64 distances of ``queries`` (n, D) to ``vectors`` (n, m, D) -> (n, m): 1 − cos, −ip, L2.

    The ground-truth stage's definitions and arithmetic (see the module docstring).
    """
    q = np.asarray(queries)[:, None, :]
    return reported(ranking_values(q, np.asarray(vectors), metric), metric)


def gamma(n: int) -> float:
    """Higham's γₙ = n·u / (1 − n·u) for float32: the relative error bound of n chained roundings."""
    nu = n * _UNIT_ROUNDOFF
    if nu >= 1:
        raise ValueError(f"a float32 sum of {n} terms has no useful error bound")
    return nu / (1 - nu)


def float32_error(metric: str, dim: int, query_norms: np.ndarray, max_vector_norm: float) -> np.ndarray:
    """Per query, a bound on |float32 kernel value − exact ranking value| for any vector of the block.

    The kernels: FAISS's ``knn_inner_product`` / ``knn_L2sqr`` (BLAS or SIMD, any summation order, L2 as
    ‖q‖² + ‖x‖² − 2 q·x or as Σ(q − x)²) and torch's matrix products in float32 (TF32 off), on float32
    copies, for cosine L2-normalised in float32 first. ``query_norms``: the queries' L2 norms;
    ``max_vector_norm``: the largest L2 norm in the block. Bounds (Higham, ch. 3):

    * ip: γ_D ‖q‖ ‖x‖;
    * cosine: normalising costs each component γ_{D+2} relative, so 3 γ_{D+2} plus the products' γ_D;
    * l2 (squared): γ_{D+3} (‖q‖ + ‖x‖)² covers both forms and the final additions.
    """
    norms = np.asarray(query_norms, dtype=np.float64)
    if metric == "cosine":
        bound = np.full(norms.shape, 4 * gamma(dim + 2))
    elif metric == "ip":
        bound = gamma(dim) * norms * max_vector_norm
    elif metric == "l2":
        bound = gamma(dim + 3) * (norms + max_vector_norm) ** 2
    else:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    # A product or sum below float32's smallest normal may be flushed to zero: at most 2^-126 each.
    return bound * _SAFETY + (dim + 4) * _SMALLEST_NORMAL
