"""Exact top-k of tie-heavy inputs under whatever BLAS kernel and SIMD level this process was started with.

Run by ``tests/dataset/test_groundtruth_determinism.py`` in subprocesses pinned to each OpenBLAS kernel
(``OPENBLAS_CORETYPE``) and FAISS SIMD level (``FAISS_SIMD_LEVEL``) the CPU can execute: it writes every
answer (ids and distances, for several thread counts and block sizes) to an ``.npz`` file, and what the
process really ran (the kernels threadpoolctl reports, FAISS's level) to a JSON file beside it.

    python tests/dataset/exact_probe.py OUT.npz [--fmnist DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

METRICS = ("cosine", "ip", "l2")
THREADS = (2,)  # per pinned process; the test's own process tries 1-3 threads and more block sizes
ROWS = (97,)


def batches(vectors: np.ndarray, size: int = 100) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for start in range(0, len(vectors), size):
        yield np.arange(start, min(start + size, len(vectors))), vectors[start : start + size]


def cases(fmnist: Path | None) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
    """name -> (base, queries, k): duplicates in long runs, near-duplicates one float32 step apart, and a
    real set (fmnist1k) with a fifth of its rows repeated."""
    rng = np.random.default_rng(5)
    distinct = rng.normal(size=(25, 448)).astype(np.float32)
    dups = distinct[rng.permutation(np.repeat(np.arange(25), 40))]  # each vector 40 times
    out = {"duplicates": (dups, rng.normal(size=(300, 448)).astype(np.float32), 100)}

    rng = np.random.default_rng(11)
    distinct = rng.normal(size=(40, 64)).astype(np.float32)
    near = np.repeat(distinct, 12, axis=0)
    step = np.arange(len(near)) % 3  # 0: the vector, 1 and 2: one component nudged by a float32 step
    column = np.arange(len(near)) % 64
    bumped = near[step > 0, column[step > 0]]
    near[step > 0, column[step > 0]] = np.nextafter(bumped, np.where(step[step > 0] == 1, np.inf, -np.inf))
    near = near[rng.permutation(len(near))]
    out["near-duplicates"] = (near, rng.normal(size=(200, 64)).astype(np.float32), 30)

    if fmnist is not None:
        from apps.interchange.vecs import read_vecs

        base = read_vecs(fmnist / "fmnist1k_base.fvecs").astype(np.float32)
        queries = read_vecs(fmnist / "fmnist1k_query.fvecs").astype(np.float32)[:100]
        out["fmnist1k"] = (np.concatenate([base, base[::5]]), queries, 50)
    return out


def answers(
    fmnist: Path | None, threads_list: tuple[int, ...] = THREADS, rows_list: tuple[int, ...] = ROWS
) -> dict[str, np.ndarray]:
    """Every (case, metric, threads, block rows) answer of the FAISS path, keyed ``case/metric/tN/rM/ids``
    (and ``/dist``), and the stage's own (``exact_topk``, its block sizes) as ``case/metric/stage/ids``."""
    from apps.dataset.groundtruth.faiss_kernel import FaissExactSearch
    from apps.dataset.groundtruth.stage import exact_topk

    out: dict[str, np.ndarray] = {}
    for name, (base, queries, k) in cases(fmnist).items():
        for metric in METRICS:
            for threads in threads_list:
                for rows in rows_list:
                    search = FaissExactSearch(queries, k, metric, threads=threads)
                    for ids, vecs in batches(base, rows):
                        search.add(ids, vecs)
                    ids, dist = search.result()
                    key = f"{name}/{metric}/t{threads}/r{rows}"
                    out[f"{key}/ids"], out[f"{key}/dist"] = ids, dist
            ids, dist = exact_topk(queries, batches(base), k, metric)  # the stage's own block sizes
            out[f"{name}/{metric}/stage/ids"], out[f"{name}/{metric}/stage/dist"] = ids, dist
    return out


def environment() -> dict[str, object]:
    """The OpenBLAS kernels and FAISS SIMD level this process runs."""
    import faiss
    import threadpoolctl

    kernels = {
        Path(info.get("filepath", "")).name: info.get("architecture")
        for info in threadpoolctl.threadpool_info()
        if info.get("internal_api") == "openblas"
    }
    simd = faiss.SIMDConfig.get_level_name() if hasattr(faiss, "SIMDConfig") else None
    return {"openblas": kernels, "faiss_simd": simd}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--fmnist", type=Path)
    args = parser.parse_args(argv)
    np.savez(args.out, **answers(args.fmnist))
    args.out.with_suffix(".json").write_text(json.dumps(environment()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
