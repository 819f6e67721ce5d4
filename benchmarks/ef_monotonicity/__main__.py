"""Does the query stage's QPS fall as ef rises? The share of adjacent ef pairs where it does, per database.

A larger ef makes HNSW search visit more of the graph, so QPS must fall as ef rises (at a fixed batch size
and client count). A measurement too short to rise above the noise breaks that order (in an early local
report Weaviate answered faster at ef=128 than at ef=64). This benchmark runs the query stage as a run
does (``apps.vdb.stages.query_sweep.query_sweep``: timed windows of ``--duration`` s after ``--warmup``
queries, each client cycling through the query set) and evaluates the raw files as the report does
(``apps.evaluate.metrics.evaluate_files``), ``--repeats`` times per database, and counts the adjacent pairs
(ef_i, ef_i+1) of each (batch size, clients) where QPS falls.

Data: the dataset, queries and exact ground truth ``configs/local.yaml`` builds (``make run``'s store;
stages not complete yet are run first, in process: ``vdb.local_dataset``). Servers: each
database's Deployment with the settings of ``configs/local.yaml``, loaded and indexed by the project's own
stages (untimed). Target: >= 90% of pairs fall, per database (pairs counted over every repeat; the share
on the medians over repeats is printed too).

    .venv/bin/python -m benchmarks.ef_monotonicity                          # 3 databases, ~25 minutes
    .venv/bin/python -m benchmarks.ef_monotonicity --databases qdrant --duration 5 --repeats 2
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from typing import Any

from apps.vdb import DATABASES as REGISTERED
from benchmarks import common
from benchmarks.common import vdb

NAME = "ef_monotonicity"
TARGET = 0.90
DATABASES = tuple(REGISTERED)
COLLECTION = "ef_bench"


def load(target: Any, data: vdb.LocalDataset, cfg: Any) -> dict[str, Any]:
    """The pipeline's insert -> searchable -> index stages (untimed set-up)."""
    from apps.vdb.stages.index import build_index
    from apps.vdb.stages.insert import insert_partition, prepare_collection, wait_searchable, work_units
    from core.store import read_manifest

    rows = int(read_manifest(data.dataset_dir)["rows"])
    started = time.monotonic()
    prepare_collection(target, True)
    units = work_units(str(data.dataset_dir))
    record = insert_partition(target, units, cfg.insert.batch_sizes[-1], 1, cfg.insert.retries)
    visible = wait_searchable(target, rows, cfg.insert.timeout_s, record)
    loaded = time.monotonic()
    index = build_index(target, rows, cfg.index_timeout_s, visible)
    return {"upload_s": loaded - started, "index_s": time.monotonic() - loaded, **index.model_dump()}


def falling_pairs(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(pairs where QPS falls as ef rises, adjacent ef pairs) over each (batch size, clients, k) group."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["batch_size"], row["clients"], row["k"]), []).append(row)
    falls = pairs = 0
    for group in groups.values():
        group.sort(key=lambda r: r["ef"])
        for low, high in itertools.pairwise(group):
            pairs += 1
            falls += high["qps"] < low["qps"]
    return falls, pairs


def run_database(database: str, data: vdb.LocalDataset, cfg: Any, args: argparse.Namespace) -> dict:
    from apps.evaluate.metrics import evaluate_files
    from apps.vdb.config import QuerySweepConfig
    from apps.vdb.records import DatabaseTarget
    from apps.vdb.stages.query_sweep import query_sweep
    from core.store import read_manifest

    settings = vdb.settings_for(database, cfg)
    dim = int(read_manifest(data.dataset_dir)["dimension"])
    spec = vdb.collection_spec(cfg, COLLECTION, dim, data.metric)
    repeats: list[dict[str, Any]] = []
    with vdb.served(database, settings, cfg.startup_timeout_s, args.keep) as (work, endpoints):
        target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=spec)
        setup = load(target, data, cfg)
        print(
            f"\n{database}: {endpoints.server_version}; loaded {setup['count']} rows in "
            f"{setup['upload_s']:.1f} s, index {setup['index_s']:.1f} s ({setup['segments']} segments)"
        )
        sweep = QuerySweepConfig(
            ef=args.ef,
            batch_size=args.batch_size,
            clients=args.clients,
            k=[args.k],
            max_queries=args.queries,
            warmup_queries=args.warmup,
            duration_s=args.duration,
        )
        for repeat in range(args.repeats):
            load_before = os.getloadavg()[0]
            started = time.monotonic()
            records = query_sweep(target, str(data.queries_file), sweep, str(work / f"r{repeat}"), None)
            rows = evaluate_files(
                [r.file for r in records],
                data.groundtruth_file,
                data.queries_file,
                data.dataset_dir,
                data.metric,
            )
            rows = [r for r in rows if r.get("status") == "ok" and not r.get("stalled")]
            falls, pairs = falling_pairs(rows)
            repeats.append(
                {
                    "repeat": repeat,
                    "load_average": [load_before, os.getloadavg()[0]],
                    "seconds": time.monotonic() - started,
                    "falls": falls,
                    "pairs": pairs,
                    "stalled": [r.setting for r in records if r.stalled],
                    "rows": [
                        {
                            key: row[key]
                            for key in (
                                "setting",
                                "ef",
                                "batch_size",
                                "clients",
                                "k",
                                "qps",
                                "recall",
                                "p99_ms",
                                "queries_sent",
                                "distinct_queries",
                                "requests",
                                "window_s",
                            )
                        }
                        for row in rows
                    ],
                }
            )
            print(
                f"  repeat {repeat + 1}/{args.repeats}: {falls}/{pairs} pairs fall "
                f"(load average {load_before:.2f} -> {os.getloadavg()[0]:.2f}, "
                f"{time.monotonic() - started:.0f} s)"
            )
            for row in repeats[-1]["rows"]:
                print(
                    f"    {row['setting']:<32} {row['qps']:9.1f} QPS  recall {row['recall']:.3f}  "
                    f"P99 {row['p99_ms']:7.2f} ms  {row['queries_sent']:>7,} queries "
                    f"({row['distinct_queries']} distinct) in {row['window_s']:.1f} s"
                )
    return {
        "database": database,
        "server_version": endpoints.server_version,
        "settings": settings.model_dump(mode="json"),
        "setup": setup,
        "repeats": repeats,
    }


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Share of falling pairs over every repeat, and on the per-setting medians over repeats."""
    falls = sum(r["falls"] for r in result["repeats"])
    pairs = sum(r["pairs"] for r in result["repeats"])
    by_setting: dict[str, list[dict[str, Any]]] = {}
    for repeat in result["repeats"]:
        for row in repeat["rows"]:
            by_setting.setdefault(row["setting"], []).append(row)
    medians = [{**rows[0], "qps": statistics.median(r["qps"] for r in rows)} for rows in by_setting.values()]
    m_falls, m_pairs = falling_pairs(medians)
    share = falls / pairs if pairs else float("nan")
    return {
        "database": result["database"],
        "falls": falls,
        "pairs": pairs,
        "ratio": share,
        "median_falls": m_falls,
        "median_pairs": m_pairs,
        "queries_sent": sum(row["queries_sent"] for r in result["repeats"] for row in r["rows"]),
        "window_s": sum(row["window_s"] for r in result["repeats"] for row in r["rows"]),
        "load_average": [x for r in result["repeats"] for x in r["load_average"]],
        "met": pairs > 0 and share >= TARGET,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", nargs="+", choices=DATABASES, default=list(DATABASES))
    parser.add_argument(
        "--ef", type=int, nargs="+", default=[16, 32, 64, 128], help="ef values (16 32 64 128)"
    )
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 32], help="queries/request (1 32)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1], help="client processes (1)")
    parser.add_argument("--k", type=int, default=10, help="neighbours per query (10)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per setting (duration_s, 10)")
    parser.add_argument("--warmup", type=int, default=16, help="warm-up queries per setting (16)")
    parser.add_argument("--queries", type=int, default=500, help="distinct queries (max_queries, 500)")
    parser.add_argument("--repeats", type=int, default=3, help="sweeps per database (3)")
    parser.add_argument("--keep", action="store_true", help="keep the server work directories")
    args = parser.parse_args()
    (common.OUT / "work").mkdir(parents=True, exist_ok=True)
    cfg = vdb.vdb_config()
    data = vdb.local_dataset()
    print(
        f"dataset {data.label()}; queries {data.queries_file} (first {args.queries}); ef {args.ef}, batch "
        f"{args.batch_size}, clients {args.clients}, k {args.k}; {args.duration:g} s per setting after "
        f"{args.warmup} warm-up queries; {args.repeats} repeats; {common.cores()} cores, load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    results = [run_database(db, data, cfg, args) for db in args.databases]
    summary = [summarise(r) for r in results]
    print(
        "\nef monotonicity: share of adjacent ef pairs where QPS falls as ef rises "
        f"(target >= {TARGET:.0%})\n"
    )
    header = (
        f"{'database':<10}{'pairs fall':>12}{'share':>8}{'on medians':>12}{'queries':>11}{'seconds':>9}  load"
    )
    print(header)
    print("-" * len(header))
    for s in summary:
        load = f"{min(s['load_average']):.2f}-{max(s['load_average']):.2f}"
        print(
            f"{s['database']:<10}{s['falls']:>6}/{s['pairs']:<5}{s['ratio']:8.0%}"
            f"{s['median_falls']:>6}/{s['median_pairs']:<5}{s['queries_sent']:>11,}{s['window_s']:>9.0f}"
            f"  {load}  "
            f"{'MET' if s['met'] else 'NOT MET'}"
        )
    print(
        "\npairs fall = adjacent (ef_i, ef_i+1) pairs of one batch size and client count, over every repeat, "
        "where QPS at ef_i+1 < QPS at ef_i; on medians = the same on each setting's median QPS over repeats; "
        "queries / seconds = queries sent and measured-window seconds summed over every setting and repeat."
    )
    path = common.write_json(
        NAME,
        {
            "machine": common.machine(),
            "dataset": data.label(),
            "args": vars(args),
            "target": TARGET,
            "summary": summary,
            "databases": results,
        },
    )
    print(f"raw numbers: {path}")


if __name__ == "__main__":
    main()
