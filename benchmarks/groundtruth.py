"""Ground-truth stage (``apps.groundtruth.exact_topk``) versus FAISS's exact flat index.

Same vectors, same queries, same k, same number of threads (``torch.set_num_threads`` and
``faiss.omp_set_num_threads``):

* **pes2o**: the newest complete dataset in ``store/datasets/`` with the pipeline's ``queries.parquet``
  (cosine: ``faiss.IndexFlatIP`` over L2-normalised copies), when a run has made one;
* **bigann10k** (L2, uint8 SIFT) and **fmnist1k** (L2) from ``../shared/data/ann``: ``faiss.IndexFlatL2``;
  their published top-100 is checked too.

Each side is timed end to end from vectors in memory to (ids, distances): the stage's normalisation and
streaming over 8,192-row batches (as ``iter_vectors`` yields them) on one side, normalisation + ``add`` +
``search`` on the other; the median of ``--repeat`` alternating runs is reported. Neighbours are compared
tie-aware: the two lists of a query agree when their distances, recomputed in float64, are the same sorted
values (members may differ only among vectors at the same distance).

    .venv/bin/python benchmarks/groundtruth.py                 # about a minute
    .venv/bin/python benchmarks/groundtruth.py --data bigann10k --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import _common
import numpy as np

NAME = "groundtruth"
TARGET = 0.8
ANN = _common.REPO.parent / "shared" / "data" / "ann"
BATCH_ROWS = 8192  # apps.dataset.iter_vectors' default batch


@dataclass
class Case:
    """One benchmark input: base vectors with their ids, queries, metric, and published neighbours."""

    name: str
    ids: np.ndarray
    base: np.ndarray
    queries: np.ndarray
    metric: str
    source: str
    published: np.ndarray | None = None


def newest_store_case(k: int) -> Case | None:
    """The newest complete pipeline dataset and a queries.parquet of the same dimension, if any."""
    import pyarrow.parquet as pq

    from apps.dataset import arrow_to_vectors, iter_vectors
    from core.store import read_manifest

    store = _common.REPO / "store"
    datasets = sorted(store.glob("datasets/*/manifest.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    queries = sorted(store.glob("queries/*/queries.parquet"), key=lambda p: p.stat().st_mtime, reverse=True)
    for manifest_path in datasets:
        manifest = read_manifest(manifest_path.parent)
        for query_file in queries:
            table = pq.read_table(query_file, columns=["embedding"])
            q = arrow_to_vectors(table.column("embedding"))
            if q.shape[1] == manifest["dimension"] and manifest["rows"] >= k:
                parts = list(iter_vectors(manifest_path.parent))
                ids = np.concatenate([i for i, _ in parts])
                base = np.concatenate([v for _, v in parts])
                where = [p.relative_to(_common.REPO) for p in (manifest_path.parent, query_file)]
                return Case("pes2o", ids, base, q, "cosine", f"{where[0]} + {where[1]}")
    return None


def ann_case(name: str) -> Case | None:
    """bigann10k or fmnist1k from the shared ANN data (L2, with published top-100)."""
    from apps.vecs import read_bin, read_vecs

    root = ANN / name
    if name == "bigann10k" and (root / "base.10k.u8bin").exists():
        base = read_bin(root / "base.10k.u8bin").astype(np.float32)
        queries = read_bin(root / "query.100.u8bin").astype(np.float32)
        published = read_bin(root / "gt100.ibin")
    elif name == "fmnist1k" and (root / "fmnist1k_base.fvecs").exists():
        base = read_vecs(root / "fmnist1k_base.fvecs")
        queries = read_vecs(root / "fmnist1k_query.fvecs")
        published = read_vecs(root / "fmnist1k_groundtruth.ivecs")
    else:
        return None
    return Case(name, np.arange(len(base), dtype=np.int64), base, queries, "l2", str(root), published)


# --- the two sides ---------------------------------------------------------------------------------------


def batches(ids: np.ndarray, base: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for start in range(0, len(base), BATCH_ROWS):
        yield ids[start : start + BATCH_ROWS], base[start : start + BATCH_ROWS]


def run_stage(case: Case, k: int, budget_mb: int) -> tuple[np.ndarray, np.ndarray]:
    from apps.groundtruth import exact_topk

    return exact_topk(case.queries, batches(case.ids, case.base), k, case.metric, "cpu", budget_mb)


def run_faiss(case: Case, k: int) -> tuple[np.ndarray, np.ndarray]:
    import faiss

    base, queries = case.base, case.queries
    if case.metric == "cosine":
        base, queries = base.copy(), queries.copy()
        faiss.normalize_L2(base)
        faiss.normalize_L2(queries)
        index = faiss.IndexFlatIP(base.shape[1])
    else:
        index = faiss.IndexFlatL2(base.shape[1])
    index.add(base)
    distances, positions = index.search(queries, k)
    return case.ids[positions], distances


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


# --- tie-aware comparison --------------------------------------------------------------------------------


def exact_distances(case: Case, rows: np.ndarray) -> np.ndarray:
    """float64 distances of each query to its base rows ``rows`` (Q, k): the referee for ties."""
    out = np.empty(rows.shape, dtype=np.float64)
    for i, (query, row) in enumerate(zip(case.queries.astype(np.float64), rows, strict=True)):
        b = case.base[row].astype(np.float64)
        if case.metric == "cosine":
            out[i] = 1.0 - (b @ query) / (np.linalg.norm(b, axis=1) * np.linalg.norm(query))
        else:
            out[i] = np.sqrt(((b - query) ** 2).sum(axis=1))
    return out


def agreement(case: Case, a: np.ndarray, b: np.ndarray, rtol: float = 1e-5) -> dict[str, Any]:
    """How two (Q, k) neighbour-id arrays agree: exactly, as sets, and up to ties (float64 referee)."""
    position = {int(i): p for p, i in enumerate(case.ids)}
    rows_a = np.vectorize(position.__getitem__)(a)
    rows_b = np.vectorize(position.__getitem__)(b)
    da = np.sort(exact_distances(case, rows_a), axis=1)
    db = np.sort(exact_distances(case, rows_b), axis=1)
    scale = np.maximum(np.abs(da), 1e-3)
    tie_ok = (np.abs(da - db) <= rtol * scale).all(axis=1)
    same_set = np.array([set(x) == set(y) for x, y in zip(a.tolist(), b.tolist(), strict=True)])
    return {
        "queries": len(a),
        "identical_lists": int((a == b).all(axis=1).sum()),
        "identical_sets": int(same_set.sum()),
        "identical_up_to_ties": int(tie_ok.sum()),
        "max_distance_gap": float(np.abs(da - db).max()),
    }


def published_recall(ids: np.ndarray, published: np.ndarray) -> float:
    k = min(ids.shape[1], published.shape[1])
    hits = sum(len(set(x[:k]) & set(y[:k])) for x, y in zip(ids.tolist(), published.tolist(), strict=True))
    return hits / (len(ids) * k)


# --- driver ----------------------------------------------------------------------------------------------


def bench(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    k = min(args.k, len(case.base))
    run_stage(case, k, args.memory_budget_mb)  # warm-up both (allocator, BLAS threads)
    run_faiss(case, k)
    stage_times, faiss_times = [], []
    for repeat in range(args.repeat):
        order = ["stage", "faiss"] if repeat % 2 == 0 else ["faiss", "stage"]
        for side in order:
            if side == "stage":
                seconds, (stage_ids, _) = timed(lambda: run_stage(case, k, args.memory_budget_mb))
                stage_times.append(seconds)
            else:
                seconds, (faiss_ids, _) = timed(lambda: run_faiss(case, k))
                faiss_times.append(seconds)
    stage_s, faiss_s = statistics.median(stage_times), statistics.median(faiss_times)
    agree = agreement(case, stage_ids, faiss_ids)
    result = {
        "case": case.name,
        "source": case.source,
        "metric": case.metric,
        "base": list(case.base.shape),
        "queries": len(case.queries),
        "k": k,
        "stage_seconds": stage_s,
        "faiss_seconds": faiss_s,
        "stage_min_seconds": min(stage_times),
        "faiss_min_seconds": min(faiss_times),
        "stage_runs": stage_times,
        "faiss_runs": faiss_times,
        "ratio": faiss_s / stage_s,  # speed of the stage relative to FAISS (> 1: faster)
        "agreement": agree,
        "all_identical_up_to_ties": agree["identical_up_to_ties"] == agree["queries"],
    }
    if case.published is not None:
        result["recall_vs_published"] = {
            "stage": published_recall(stage_ids, case.published),
            "faiss": published_recall(faiss_ids, case.published),
        }
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        nargs="+",
        default=["pes2o", "bigann10k", "fmnist1k"],
        choices=["pes2o", "bigann10k", "fmnist1k"],
        help="inputs (default: all that exist)",
    )
    parser.add_argument("--k", type=int, default=100, help="neighbours per query (default 100)")
    parser.add_argument("--threads", type=int, default=None, help="torch and FAISS threads (default: cores)")
    parser.add_argument("--repeat", type=int, default=15, help="timed runs per side, alternating (15)")
    parser.add_argument("--memory-budget-mb", type=int, default=256, help="as configs/local.yaml (256)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    import faiss
    import torch

    threads = args.threads or _common.cores()
    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    loaders = {"pes2o": lambda: newest_store_case(args.k), "bigann10k": lambda: ann_case("bigann10k")}
    loaders["fmnist1k"] = lambda: ann_case("fmnist1k")
    results = []
    print(f"exact_topk (torch) vs FAISS IndexFlat, {threads} threads each, median of {args.repeat} runs")
    for name in args.data:
        case = loaders[name]()
        if case is None:
            print(f"\n{name}: no data (pes2o needs a finished pipeline run in store/); skipped")
            continue
        r = bench(case, args)
        results.append(r)
        a = r["agreement"]
        faiss_kind = "IndexFlatIP on normalised vectors" if case.metric == "cosine" else "IndexFlatL2"
        print(
            f"\n{name}: {r['base'][0]:,} x {r['base'][1]} base, {r['queries']} queries, k={r['k']}, "
            f"{case.metric} ({case.source})\n"
            f"  exact_topk  {r['stage_seconds'] * 1000:8.1f} ms  "
            f"(fastest run {r['stage_min_seconds'] * 1000:.1f})\n"
            f"  FAISS       {r['faiss_seconds'] * 1000:8.1f} ms  "
            f"(fastest run {r['faiss_min_seconds'] * 1000:.1f}; {faiss_kind})\n"
            f"  speed ratio {r['ratio']:.2f}x of FAISS (target >= {TARGET}x); fastest runs: "
            f"{r['faiss_min_seconds'] / r['stage_min_seconds']:.2f}x\n"
            f"  neighbours  identical lists {a['identical_lists']}/{a['queries']}, identical sets "
            f"{a['identical_sets']}/{a['queries']}, identical up to ties {a['identical_up_to_ties']}/"
            f"{a['queries']} (max float64 distance gap {a['max_distance_gap']:.1e})"
        )
        if "recall_vs_published" in r:
            rec = r["recall_vs_published"]
            print(f"  published top-{r['k']}: recall {rec['stage']:.4f} (stage), {rec['faiss']:.4f} (FAISS)")
    if not results:
        raise SystemExit("no input data found")
    worst = min(r["ratio"] for r in results)
    identical = all(r["all_identical_up_to_ties"] for r in results)
    met = worst >= TARGET and identical
    print(
        f"\ngroundtruth: worst speed ratio {worst:.2f}x of FAISS (target >= {TARGET}x), neighbours identical "
        f"up to ties: {'yes' if identical else 'NO'}: {'MET' if met else 'NOT MET'}"
    )
    path = _common.write_json(
        NAME, {"threads": threads, "results": results, "worst_ratio": worst, "target": TARGET, "met": met}
    )
    print(f"raw numbers: {path}")


if __name__ == "__main__":
    main()
