"""QPS measured by the query stage versus a minimal direct client loop with the same parameters.

One server per database (the adapter's Deployment, settings of ``configs/local.yaml``) is loaded and
indexed by the project's own stages (prepare_collection -> insert_partition -> wait_searchable ->
build_index; untimed). Then, for each setting (ef, batch size, k; 1 client) and repeat, in alternating
order:

* **harness**: ``apps.vdb.stages.query_sweep.query_sweep`` for that one setting (its client process, warm-up,
raw
  Parquet output); QPS and latency computed from the raw rows with ``apps.evaluate.metrics.qps`` /
  ``latency_stats``;
* **direct**: the same query vectors, warm-up, batches, k and ef sent with the vendor client's own call
  in a plain loop in this process, timed the same way (first request start -> last request end):
  Weaviate ``collection.query.near_vector`` per query (a batch fans out over the same number of
  threads as the adapter's ``search_threads``; ef set on the collection config, as Weaviate requires),
  pymilvus ``MilvusClient.search`` with ``{"ef": max(ef, k)}`` and the adapter's consistency level,
  Qdrant edge ``EdgeShard.query_batch`` on the shard directory. Returned ids are kept, so neither side
  does less work, and the two sides' ids are compared.

Ratio = median over repeats of harness QPS / direct QPS of adjacent pairs. Target >= 0.95x.

The direct loops live in ``direct.py``; the load through the stages in ``benchmarks.common.vdb``; this
file holds the data, the harness side and the driver.

    .venv/bin/python -m benchmarks.query_harness                    # all three databases, ~5 minutes
    .venv/bin/python -m benchmarks.query_harness --databases milvus --ef 32 128 --batch-size 1 32
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from benchmarks import common
from benchmarks.common import vdb
from benchmarks.query_harness.direct import DIRECT_CALL, run_direct

NAME = "query_harness"
TARGET = 0.95
DATABASES = tuple(DIRECT_CALL)  # the databases with a direct vendor-client loop to compare against
COLLECTION = "query_bench"
DEFAULT_ROWS = 10_000  # random unit vectors when no project dataset was built (common/vdb.bench_dataset)


# --- data --------------------------------------------------------------------------------------------------


# --- the harness: the project's query stage ----------------------------------------------------------------


def run_harness(ctx: dict[str, Any], setting: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """query_sweep for one setting with 1 client; metrics from its raw Parquet output."""
    from apps.evaluate.metrics import latency_stats, qps
    from apps.vdb.config import QuerySweepConfig
    from apps.vdb.stages.query_sweep import query_sweep

    query_cfg = QuerySweepConfig(
        ef=[setting["ef"]],
        batch_size=[setting["batch_size"]],
        clients=[1],
        k=[setting["k"]],
        max_queries=ctx["max_queries"],
        warmup_queries=ctx["warmup"],
        duration_s=None,  # one pass, as the direct loop it is compared with
    )
    called = time.time()
    records = query_sweep(vdb.target_of(ctx), str(ctx["queries_file"]), query_cfg, str(out_dir), None)
    returned = time.time()
    raw = pq.read_table(records[0].file)
    stats = latency_stats(raw)
    return {
        "queries": raw.num_rows,
        "qps": qps(raw),
        "latency_mean_ms": stats["latency_mean_ms"],
        "p50_ms": stats["p50_ms"],
        "p99_ms": stats["p99_ms"],
        "task_s": returned - called,
        "phase_s": max(raw.column("t_end").to_pylist()) - min(raw.column("t_start").to_pylist()),
        "ids": raw.column("ids").to_pylist(),
    }


# --- driver ------------------------------------------------------------------------------------------------


def run_database(database: str, data: dict[str, Any], cfg: Any, args: argparse.Namespace) -> dict[str, Any]:

    settings = vdb.settings_for(database, cfg)
    spec = vdb.collection_spec(cfg, COLLECTION, data["vectors"].shape[1], data["metric"])
    runs: list[dict[str, Any]] = []
    with vdb.served(database, settings, cfg.startup_timeout_s, args.keep) as (work, endpoints):
        ctx = vdb.context(
            database,
            settings,
            endpoints,
            spec,
            data,
            queries_file=data["queries_file"],
            max_queries=args.queries,
            warmup=args.warmup,
        )
        setup = vdb.load_collection(ctx, cfg)
        print(
            f"\n{database}: {endpoints.server_version}; loaded {setup['count']} rows in "
            f"{setup['upload_s']:.1f} s, index {setup['index_s']:.1f} s ({setup['segments']} segments)"
        )
        from apps.vdb.stages.query_sweep import read_queries

        _, vectors = read_queries(str(data["queries_file"]), args.queries)
        settings_list = [
            {"ef": ef, "batch_size": b, "k": k} for ef in args.ef for b in args.batch_size for k in args.k
        ]
        for setting in settings_list:
            for repeat in range(args.repeats):
                order = ["harness", "direct"] if repeat % 2 == 0 else ["direct", "harness"]
                pair: dict[str, dict[str, Any]] = {}
                for side in order:
                    if side == "harness":
                        pair[side] = run_harness(ctx, setting, work / "raw" / f"{len(runs)}")
                    else:
                        pair[side] = run_direct(ctx, vectors, setting, args.warmup)
                a, b = pair["harness"].pop("ids"), pair["direct"].pop("ids")
                same = float(np.mean([list(x) == list(y) for x, y in zip(a, b, strict=True)]))
                run = {"database": database, **setting, "repeat": repeat, **pair, "same_ids": same}
                run["ratio"] = pair["harness"]["qps"] / pair["direct"]["qps"]
                runs.append(run)
                print(
                    f"  ef={setting['ef']} batch={setting['batch_size']} k={setting['k']} "
                    f"[{repeat + 1}/{args.repeats}] harness {pair['harness']['qps']:8.1f} QPS "
                    f"(mean {pair['harness']['latency_mean_ms']:6.2f} ms)  direct "
                    f"{pair['direct']['qps']:8.1f} QPS (mean {pair['direct']['latency_mean_ms']:6.2f} ms)  "
                    f"ratio {run['ratio']:.2f}x  same ids {same:.0%}",
                    flush=True,
                )
    return {
        "database": database,
        "server_version": endpoints.server_version,
        "direct_call": DIRECT_CALL[database],
        "settings": settings.model_dump(mode="json"),
        "spec": spec.model_dump(),
        "setup": setup,
        "runs": runs,
    }


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for result in results:
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for run in result["runs"]:
            groups.setdefault((run["ef"], run["batch_size"], run["k"]), []).append(run)
        for (ef, batch, k), runs in groups.items():
            h = statistics.median(r["harness"]["qps"] for r in runs)
            d = statistics.median(r["direct"]["qps"] for r in runs)
            rows.append(
                {
                    "database": result["database"],
                    "ef": ef,
                    "batch_size": batch,
                    "k": k,
                    "n": len(runs),
                    "harness_qps": h,
                    "direct_qps": d,
                    "ratio": statistics.median(r["ratio"] for r in runs),
                    "ratio_of_medians": h / d,
                    "ratio_per_repeat": [round(r["ratio"], 3) for r in runs],
                    "harness_latency_ms": statistics.median(r["harness"]["latency_mean_ms"] for r in runs),
                    "direct_latency_ms": statistics.median(r["direct"]["latency_mean_ms"] for r in runs),
                    "harness_task_s": statistics.median(r["harness"]["task_s"] for r in runs),
                    "same_ids": min(r["same_ids"] for r in runs),
                    "met": statistics.median(r["ratio"] for r in runs) >= TARGET,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", nargs="+", choices=DATABASES, default=list(DATABASES))
    parser.add_argument("--ef", type=int, nargs="+", default=[64], help="search-time ef (64)")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 32], help="queries/request (1 32)")
    parser.add_argument("--k", type=int, nargs="+", default=[10], help="neighbours per query (10)")
    parser.add_argument("--queries", type=int, default=500, help="queries per setting (max_queries, 500)")
    parser.add_argument("--warmup", type=int, default=16, help="warm-up queries (warmup_queries, 16)")
    parser.add_argument("--rows", type=int, default=None, help="first N dataset rows (default all)")
    parser.add_argument("--repeats", type=int, default=5, help="harness/direct pairs per setting (5)")
    parser.add_argument("--keep", action="store_true", help="keep the server work directories")
    args = parser.parse_args()
    (common.OUT / "work").mkdir(parents=True, exist_ok=True)
    cfg = vdb.vdb_config()
    data = vdb.bench_dataset(args.rows, DEFAULT_ROWS)
    data["queries_file"] = vdb.bench_queries(data["vectors"].shape[1])
    shown = data["queries_file"]
    with contextlib.suppress(ValueError):
        shown = shown.relative_to(common.REPO)
    print(
        f"{len(data['ids'])} vectors x {data['vectors'].shape[1]} from {data['label']}; queries {shown} "
        f"(first {args.queries}), warm-up {args.warmup}, 1 client; {args.repeats} repeats; "
        f"{common.cores()} cores, load average {os.getloadavg()[0]:.2f}"
    )
    results = [run_database(db, data, cfg, args) for db in args.databases]
    rows = summarise(results)
    print(
        f"\nquery harness: QPS of the query stage vs a direct client loop (median of {args.repeats}, "
        "1 client)\n"
    )
    header = (
        f"{'database':<10}{'ef':>5}{'batch':>6}{'k':>4}{'harness QPS':>13}{'direct QPS':>12}{'ratio':>8}"
        f"{'r(med)':>8}"
        f"{'lat h ms':>10}{'lat d ms':>10}{'same ids':>10}  target"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['database']:<10}{r['ef']:>5}{r['batch_size']:>6}{r['k']:>4}{r['harness_qps']:13.1f}"
            f"{r['direct_qps']:12.1f}{r['ratio']:7.2f}x{r['ratio_of_medians']:7.2f}x{r['harness_latency_ms']:10.2f}"
            f"{r['direct_latency_ms']:10.2f}{r['same_ids']:10.0%}  "
            f"{'MET' if r['met'] else 'NOT MET'} (>= {TARGET}x)"
        )
    print(
        "\nratio = median over repeats of harness QPS / direct QPS of the same (adjacent) pair; r(med) = "
        "median harness QPS / median direct QPS. "
        "QPS = queries / (last request end - first request start), both sides; the harness's from its raw "
        "Parquet rows (apps.evaluate.metrics.qps). lat = mean request latency. same ids = share of queries "
        "whose returned id lists are identical on both sides (worst repeat)."
    )
    path = common.write_json(
        NAME,
        {
            "dataset": data["label"],
            "rows": len(data["ids"]),
            "queries_file": str(data["queries_file"]),
            "queries": args.queries,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "target": TARGET,
            "summary": rows,
            "databases": results,
        },
    )
    print(f"raw numbers: {path}")


if __name__ == "__main__":
    main()
