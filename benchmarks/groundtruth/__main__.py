"""Ground-truth stage (``apps.dataset.groundtruth.stage.exact_topk``) versus FAISS's exact flat index.

Same vectors, same queries, same k, same number of threads (``faiss.omp_set_num_threads``, and
``torch.set_num_threads`` for a torch engine):

* **pes2o**: the newest complete dataset in ``store/datasets/`` with the pipeline's ``queries.parquet``
  (cosine: ``faiss.IndexFlatIP`` over L2-normalised copies), when a run has made one;
* **bigann10k** (L2, uint8 SIFT) and **fmnist1k** (L2) from ``../shared/data/ann``: ``faiss.IndexFlatL2``;
  their published top-100 is checked too;
* **random**: random normal vectors (200,000 x 384 base, 1,000 queries, cosine by default), a size where
  the arithmetic dominates; random, so a speed figure only.

Each side is timed end to end from vectors in memory to (ids, distances): the stage's streaming over
``--batch-rows`` batches (8,192, as ``iter_vectors`` yields by default; regrouped into blocks within the
memory budget of ``configs/local.yaml``) on one side, normalisation + ``add`` + ``search`` on the other.
Sides alternate; the figures are medians of ``--repeat`` runs (more for small inputs, until each side's
timed work is ``--min-seconds``), and the ratio is the stage's throughput
(queries/s) over FAISS's. Neighbours are compared tie-aware: the two lists of a query agree when their
distances, recomputed in float64, are the same sorted values (members may differ only among vectors at
the same distance). The stage's working memory (numpy, by tracemalloc, plus FAISS's own tiles and
reservoirs, computed) is measured in one more, untimed run.

    .venv/bin/python -m benchmarks.groundtruth                 # a few minutes on 2 cores
    .venv/bin/python -m benchmarks.groundtruth --data bigann10k --threads 1
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks import common

NAME = "groundtruth"
TARGET = 1.0
ANN = common.SHARED_DATA / "ann"


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

    from apps.dataset.layout import arrow_to_vectors, iter_vectors
    from core.store import read_manifest

    store = common.REPO / "store"
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
                where = [p.relative_to(common.REPO) for p in (manifest_path.parent, query_file)]
                return Case("pes2o", ids, base, q, "cosine", f"{where[0]} + {where[1]}")
    return None


def ann_case(name: str) -> Case | None:
    """bigann10k or fmnist1k from the shared ANN data (L2, with published top-100)."""
    from apps.interchange.vecs import read_bin, read_vecs

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


def random_case(args: argparse.Namespace) -> Case:
    """Random normal vectors: a size where the arithmetic dominates (a speed figure, not a data set)."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((args.random_rows, args.random_dim), dtype=np.float32)
    queries = rng.standard_normal((args.random_queries, args.random_dim), dtype=np.float32)
    ids = np.arange(len(base), dtype=np.int64)
    source = f"RANDOM normal vectors, seed 0: {args.random_rows:,} x {args.random_dim} base"
    return Case("random", ids, base, queries, args.random_metric, source)


# --- the two sides ---------------------------------------------------------------------------------------


def batches(ids: np.ndarray, base: np.ndarray, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for start in range(0, len(base), rows):
        yield ids[start : start + rows], base[start : start + rows]


def run_stage(
    case: Case, k: int, args: argparse.Namespace, stats: dict[str, Any] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    from apps.dataset.groundtruth.stage import exact_topk

    return exact_topk(
        case.queries,
        batches(case.ids, case.base, args.batch_rows),
        k,
        case.metric,
        args.device,
        args.memory_budget_mb,
        stats=stats,
    )


def run_faiss(case: Case, k: int) -> tuple[np.ndarray, np.ndarray]:
    import faiss

    base, queries = case.base, case.queries
    if case.metric == "cosine":
        base, queries = base.copy(), queries.copy()
        faiss.normalize_L2(base)
        faiss.normalize_L2(queries)
        index = faiss.IndexFlatIP(base.shape[1])
    elif case.metric == "ip":
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
        elif case.metric == "ip":
            out[i] = -(b @ query)
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


# --- memory ----------------------------------------------------------------------------------------------


def working_memory(case: Case, k: int, args: argparse.Namespace) -> dict[str, Any]:
    """The stage's peak working memory in one untimed run: numpy and Python allocations (tracemalloc;
    the inputs exist before it starts) plus what FAISS allocates itself (C++, computed)."""
    from apps.dataset.groundtruth.faiss_kernel import default_threads, faiss_scratch_bytes, query_slices

    stats: dict[str, Any] = {}
    tracemalloc.start()
    try:
        run_stage(case, k, args, stats)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    budget = args.memory_budget_mb * 2**20
    scratch, parallel = 0, 1
    if stats.get("engine") == "faiss":
        shape = (len(case.queries), case.queries.shape[1], k, budget, default_threads())
        scratch = faiss_scratch_bytes(*shape)
        parallel = query_slices(*shape)[1]
    return {
        **stats,
        "traced_peak_bytes": peak,
        "faiss_scratch_bytes": scratch,
        "budget_bytes": budget,
        "query_slices_at_once": parallel,
    }


MAX_REPEAT = 401

# --- driver ----------------------------------------------------------------------------------------------


def bench(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    k = min(args.k, len(case.base))
    repeat = args.random_repeat if case.name == "random" else args.repeat
    load_before = os.getloadavg()
    run_stage(case, k, args)  # warm-up both (allocator, BLAS threads)
    one, _ = timed(lambda: run_faiss(case, k))
    # A figure rests on seconds of work, not milliseconds: small inputs get more runs (fmnist1k's 500
    # queries take ~10 ms a side, so 15 runs were 0.15 s, and one stall on this shared machine moved it).
    repeat = max(repeat, min(MAX_REPEAT, math.ceil(args.min_seconds / max(one, 1e-4))))
    stage_times: list[float] = []
    faiss_times: list[float] = []
    for r in range(repeat):
        order = ["stage", "faiss"] if r % 2 == 0 else ["faiss", "stage"]
        for side in order:
            if side == "stage":
                seconds, (stage_ids, _) = timed(lambda: run_stage(case, k, args))
                stage_times.append(seconds)
            else:
                seconds, (faiss_ids, _) = timed(lambda: run_faiss(case, k))
                faiss_times.append(seconds)
    load_after = os.getloadavg()
    stage_s, faiss_s = statistics.median(stage_times), statistics.median(faiss_times)
    agree = agreement(case, stage_ids, faiss_ids)
    ratio = faiss_s / stage_s  # throughput of the stage over FAISS's (same queries): > 1 is faster
    identical = agree["identical_up_to_ties"] == agree["queries"]
    memory = working_memory(case, k, args)
    within = memory["traced_peak_bytes"] + memory["faiss_scratch_bytes"] <= memory["budget_bytes"]
    result = {
        "case": case.name,
        "source": case.source,
        "metric": case.metric,
        "base": list(case.base.shape),
        "queries": len(case.queries),
        "k": k,
        "repeat": repeat,
        "stage_seconds": stage_s,
        "faiss_seconds": faiss_s,
        "stage_qps": len(case.queries) / stage_s,
        "faiss_qps": len(case.queries) / faiss_s,
        "stage_runs": stage_times,
        "faiss_runs": faiss_times,
        "paired_ratios": [f / s for s, f in zip(stage_times, faiss_times, strict=True)],
        "ratio": ratio,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "agreement": agree,
        "all_identical_up_to_ties": identical,
        "memory": memory,
        "within_budget": within,
        "met": ratio >= TARGET and identical and within,
    }
    if case.published is not None:
        result["recall_vs_published"] = {
            "stage": published_recall(stage_ids, case.published),
            "faiss": published_recall(faiss_ids, case.published),
        }
    return result


def report(r: dict[str, Any], threads: int) -> None:
    """Print one case: both sides, the ratio and what it rests on, load, neighbours, memory."""
    a, m, q, n = r["agreement"], r["memory"], r["queries"], r["repeat"]
    kind = {"cosine": "IndexFlatIP on normalised vectors", "ip": "IndexFlatIP", "l2": "IndexFlatL2"}
    load = " ".join(f"{x:.2f}" for x in r["load_average_before"])
    load_after = " ".join(f"{x:.2f}" for x in r["load_average_after"])
    paired = sorted(r["paired_ratios"])
    print(
        f"\n{r['case']}: {r['base'][0]:,} x {r['base'][1]} base, {q:,} queries, k={r['k']}, {r['metric']} "
        f"({r['source']})\n"
        f"  stage  {r['stage_seconds'] * 1000:9.1f} ms median = {r['stage_qps']:10,.0f} queries/s "
        f"(engine {m.get('engine')}, blocks of {m.get('block_rows', 0):,} rows, "
        f"{m['query_slices_at_once']} query slice(s) at once, one thread each)\n"
        f"  FAISS  {r['faiss_seconds'] * 1000:9.1f} ms median = {r['faiss_qps']:10,.0f} queries/s "
        f"({kind[r['metric']]}, add + search, {threads} OpenMP threads in each call)\n"
        f"  each median rests on {n} runs x {q:,} queries = {n * q:,} queries per side, "
        f"{sum(r['stage_runs']):.2f} s (stage) and {sum(r['faiss_runs']):.2f} s (FAISS) timed; "
        f"{threads} threads each\n"
        f"  load average (1/5/15 min) before {load}, after {load_after}\n"
        f"  ratio {r['ratio']:.2f}x of FAISS's throughput (target >= {TARGET}x): "
        f"{'MET' if r['met'] else 'NOT MET'}; run-by-run ratios {paired[0]:.2f}..{paired[-1]:.2f} "
        f"(median {statistics.median(paired):.2f})\n"
        f"  neighbours  identical lists {a['identical_lists']}/{q}, identical sets "
        f"{a['identical_sets']}/{q}, identical up to ties {a['identical_up_to_ties']}/{q} "
        f"(max float64 distance gap {a['max_distance_gap']:.1e})\n"
        f"  memory  stage peak {m['traced_peak_bytes'] / 2**20:.1f} MiB (numpy) + "
        f"{m['faiss_scratch_bytes'] / 2**20:.1f} MiB (FAISS's tiles and reservoirs) of the "
        f"{m['budget_bytes'] / 2**20:.0f} MiB "
        f"budget: {'within' if r['within_budget'] else 'OVER'}; "
        f"{m.get('repeated_searches', 0)} of {m.get('block_searches', 0)} block searches repeated "
        "for (near) ties at the k-th place"
    )
    if "recall_vs_published" in r:
        rec = r["recall_vs_published"]
        print(f"  published top-{r['k']}: recall {rec['stage']:.4f} (stage), {rec['faiss']:.4f} (FAISS)")


def configured_budget() -> int:
    """groundtruth.memory_budget_mb of configs/local.yaml (the default run's budget)."""
    import yaml

    return int(yaml.safe_load(common.LOCAL_CONFIG.read_text())["groundtruth"]["memory_budget_mb"])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n\n")[0])
    datasets = ["pes2o", "bigann10k", "fmnist1k", "random"]
    parser.add_argument("--data", nargs="+", default=datasets, choices=datasets, help="inputs (default: all)")
    parser.add_argument("--k", type=int, default=100, help="neighbours per query (default 100)")
    parser.add_argument("--threads", type=int, default=None, help="FAISS (torch) threads (default: cores)")
    parser.add_argument("--repeat", type=int, default=15, help="timed runs per side, alternating (15)")
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=3.0,
        help=f"more runs until each side's timed work is about this long (3 s; at most {MAX_REPEAT} runs)",
    )
    parser.add_argument("--random-repeat", type=int, default=5, help="timed runs per side, random case (5)")
    parser.add_argument("--random-rows", type=int, default=200_000, help="random base rows (200,000)")
    parser.add_argument("--random-dim", type=int, default=384, help="random dimension (384)")
    parser.add_argument("--random-queries", type=int, default=1000, help="random queries (1,000)")
    parser.add_argument("--random-metric", choices=["cosine", "ip", "l2"], default="cosine")
    parser.add_argument("--batch-rows", type=int, default=8192, help="rows per input batch (8,192)")
    parser.add_argument("--device", default="cpu", help="the stage's device (cpu: FAISS; cuda/xpu: torch)")
    parser.add_argument(
        "--memory-budget-mb", type=int, default=None, help="the stage's budget (default: configs/local.yaml)"
    )
    args = parser.parse_args()
    args.memory_budget_mb = args.memory_budget_mb or configured_budget()
    return args


def main() -> None:
    args = parse_args()
    import faiss

    threads = args.threads or common.cores()
    faiss.omp_set_num_threads(threads)
    if args.device != "cpu":
        import torch

        torch.set_num_threads(threads)
    loaders: dict[str, Callable[[], Case | None]] = {
        "pes2o": lambda: newest_store_case(args.k),
        "bigann10k": lambda: ann_case("bigann10k"),
        "fmnist1k": lambda: ann_case("fmnist1k"),
        "random": lambda: random_case(args),
    }
    results = []
    print(
        f"ground-truth stage vs FAISS IndexFlat, k={args.k}, {threads} threads each, device {args.device}, "
        f"memory budget {args.memory_budget_mb} MiB, faiss {faiss.__version__}; alternating sides, medians; "
        f"load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    for name in args.data:
        case = loaders[name]()
        if case is None:
            print(f"\n{name}: no data (pes2o needs a finished pipeline run in store/); skipped")
            continue
        results.append(bench(case, args))
        report(results[-1], threads)
    if not results:
        raise SystemExit("no input data found")
    worst = min(r["ratio"] for r in results)
    met = all(r["met"] for r in results)
    summary = ", ".join(f"{r['case']} {r['ratio']:.2f}x {'MET' if r['met'] else 'NOT MET'}" for r in results)
    print(
        f"\ngroundtruth: {summary}; worst speed ratio {worst:.2f}x of FAISS (target >= {TARGET}x on each, "
        f"identical neighbours up to ties, within the memory budget): {'MET' if met else 'NOT MET'}"
    )
    path = common.write_json(
        NAME,
        {"threads": threads, "results": results, "worst_ratio": worst, "target": TARGET, "met": met},
    )
    print(f"raw numbers: {path}")


if __name__ == "__main__":
    main()
