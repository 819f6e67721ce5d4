"""Peer benchmark: the project's query stage versus VectorDBBench on the same server, collection and queries.

Data: the dataset, queries and exact ground truth that ``configs/local.yaml`` builds (missing stages are run
first, into the repository's ``store/``), exported to VectorDBBench's custom-dataset layout
(``train.parquet`` id+emb, ``test.parquet`` id+emb, ``neighbors.parquet`` id+neighbors_id) under
``benchmarks/out/work/``. VectorDBBench 2.0 runs from its own venv under ``benchmarks/out/`` (made once:
``vdbbench_venv.py`` says what is pinned and the one line patched, and why).

Per database (Weaviate, Milvus; the project's deployments with configs/local.yaml's settings) one server is
started and one collection loaded (``sides.load_collection``; Milvus then compacted), in the name
VectorDBBench uses. Then, ``--repeats`` times, per client count, the two sides back to back (the first one
alternating):

* **VectorDBBench**: its ``PerformanceCustomDataset`` case, search-only (the collection is loaded:
  ``--skip-drop-old --skip-load``), k, HNSW ef: concurrent search for ``--duration`` s at that client
  count (its QPS and p99), then its serial pass over the test set (its recall);
* **project**: ``apps.vdb.stages.query_sweep.query_sweep`` with batch 1, the same k, ef and client count, over
the
  same queries cycled to ``--project-queries`` (QPS, p99, recall from its raw Parquet rows).

Ratio = median over repeats of project QPS / VectorDBBench QPS. MET when >= 1.0 and the project's recall
is not lower. VectorDBBench's figures are checked: a QPS of 0, query counts that do not give its QPS, or a
recall that differs from one recomputed here from the ids its own ``search_embedding`` returns stop the run.

    .venv/bin/python -m benchmarks.peer_vectordbbench                 # both databases, ~8-12 minutes
    .venv/bin/python -m benchmarks.peer_vectordbbench --databases milvus --repeats 1 --duration 5
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks import common
from benchmarks.common import vdb
from benchmarks.peer_vectordbbench import data as peer_data
from benchmarks.peer_vectordbbench import report as peer_report
from benchmarks.peer_vectordbbench import sides, vdbbench_venv

NAME = "peer_vectordbbench"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--databases", nargs="+", choices=("weaviate", "milvus"), default=["weaviate", "milvus"]
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2], help="client processes (1 2)")
    parser.add_argument("--k", type=int, default=10, help="neighbours per query (10)")
    parser.add_argument("--ef", type=int, default=64, help="HNSW search ef (64)")
    parser.add_argument(
        "--duration", type=int, default=10, help="VectorDBBench seconds per client count (10)"
    )
    parser.add_argument(
        "--project-queries", type=int, default=5000, help="project queries per setting (5000)"
    )
    parser.add_argument("--warmup", type=int, default=16, help="project warm-up queries per client (16)")
    parser.add_argument("--repeats", type=int, default=4, help="alternating pairs (4)")
    parser.add_argument("--keep", action="store_true", help="keep the server and raw directories")
    return parser.parse_args()


def cycled_queries(queries_file: Path, total: int) -> Path:
    """The query set repeated (ids kept) to ``total`` rows: what the project's side sends."""
    import pyarrow.parquet as pq

    from core.store import write_parquet_atomic

    path = common.OUT / "work" / f"peer-queries-{queries_file.parent.name}-{total}.parquet"
    if not path.exists():
        table = pq.read_table(queries_file, columns=["id", "embedding"])
        index = np.arange(total) % table.num_rows
        write_parquet_atomic(table.take(pa.array(index)), path)
    return path


def check_vdbbench(database: str, result: dict[str, Any], recomputed: float, clients: list[int]) -> None:
    """Stop the run when VectorDBBench's figures are not real measurements."""
    metric, problems = result["metric"], []
    for c, qps in zip(metric["conc_num_list"], metric["conc_qps_list"], strict=True):
        seen = result["concurrent"].get(str(c))
        if not qps or not seen or not seen["queries"]:
            problems.append(f"{c} client(s): QPS {qps}, log {seen} (searches failed: see driver.log)")
        elif abs(seen["queries"] / seen["seconds"] - qps) > 0.01 * qps:
            problems.append(
                f"{c} client(s): {seen['queries']} queries in {seen['seconds']:.2f} s is not {qps} QPS"
            )
    if sorted(metric["conc_num_list"]) != sorted(clients):
        problems.append(f"ran client counts {metric['conc_num_list']}, asked {clients}")
    if not metric["recall"] or abs(metric["recall"] - round(recomputed, 4)) > 1.01e-4:
        problems.append(f"its recall {metric['recall']} != {recomputed:.4f} recomputed from its returned ids")
    if problems:
        raise SystemExit(f"VectorDBBench ({database}) figures are not real: " + "; ".join(problems))


def vdbbench_side(
    ctx: dict[str, Any],
    python: Path,
    export: dict,
    tables: dict,
    args: argparse.Namespace,
    clients: int,
    work: Path,
) -> dict[str, Any]:
    """VectorDBBench at one client count (its serial pass too), its figures checked."""
    database, qids = ctx["database"], tables["query_ids"]
    if database == "weaviate" and sides.server_ef(ctx) != args.ef:
        raise SystemExit(f"weaviate: the collection's ef is {sides.server_ef(ctx)}, not {args.ef}")
    result = sides.run_vdbbench(python, ctx, args, export, clients, work)
    ids = result.pop("ids")
    recomputed = sides.plain_recall(qids, ids, tables["gt_ids"], tables["gt"], args.k)
    check_vdbbench(database, result, recomputed, [clients])
    metric, seen = result["metric"], result["concurrent"][str(clients)]
    return {
        "qps": metric["conc_qps_list"][0],
        "p99_ms": metric["conc_latency_p99_list"][0] * 1000,
        "queries": seen["queries"],
        "seconds": seen["seconds"],
        "recall": metric["recall"],
        "recall_recomputed": recomputed,
        "recall_tie_aware": sides.tie_aware_recall(qids, ids, tables, args.k, ctx["metric"]),
        "serial_queries": result["serial_queries"],
        "serial_p99_ms": metric["serial_latency_p99"] * 1000,
        "first_ids": {int(q): i for q, i in zip(qids, ids, strict=True)},
    }


def project_side(
    ctx: dict[str, Any], tables: dict, args: argparse.Namespace, clients: int, work: Path
) -> dict:
    """The query stage at one client count; recall from its rows."""
    run = sides.run_project(ctx, clients, args, work)
    qids, ids = run.pop("query_ids"), run.pop("ids")
    run["recall"] = sides.plain_recall(qids, ids, tables["gt_ids"], tables["gt"], args.k)
    run["recall_tie_aware"] = sides.tie_aware_recall(qids, ids, tables, args.k, ctx["metric"])
    run["first_ids"] = dict(zip(qids.tolist(), ids, strict=True))
    return run


def measure_pair(
    ctx: dict[str, Any],
    python: Path,
    export: dict,
    tables: dict,
    args: argparse.Namespace,
    repeat: int,
    work: Path,
) -> dict[str, Any]:
    """Per client count, one VectorDBBench run and one project run back to back; the side that goes first
    alternates from one run to the next."""
    database = ctx["database"]
    pair: dict[str, Any] = {"repeat": repeat, "order": {}, "vdbbench": {}, "project": {}}
    segments = sides.milvus_segments(ctx) if database == "milvus" else None
    for n, c in enumerate(args.clients):
        order = ["vdbbench", "project"] if (repeat + n) % 2 == 0 else ["project", "vdbbench"]
        pair["order"][str(c)] = order
        pair.setdefault("load_average", {})[str(c)] = os.getloadavg()
        for side in order:
            where = work / f"{side}-{repeat}-{c}"
            if side == "vdbbench":
                pair[side][str(c)] = vdbbench_side(ctx, python, export, tables, args, c, where)
            else:
                pair[side][str(c)] = project_side(ctx, tables, args, c, where)
        vdb_first = pair["vdbbench"][str(c)].pop("first_ids")
        mine = pair["project"][str(c)].pop("first_ids")
        pair["project"][str(c)]["same_ids"] = float(
            np.mean([list(mine[q][: args.k]) == vdb_first[q] for q in vdb_first])
        )
    if database == "milvus" and sides.milvus_segments(ctx) != segments:
        raise SystemExit(
            f"milvus: the served segments changed during repeat {repeat + 1}: {segments} -> "
            f"{sides.milvus_segments(ctx)}; the two sides did not search the same index"
        )
    return pair


def run_database(
    database: str, python: Path, data: dict, export: dict, tables: dict, args: argparse.Namespace
) -> dict:

    cfg = vdb.vdb_config()
    settings = vdb.settings_for(database, cfg)
    spec = vdb.collection_spec(cfg, sides.COLLECTION[database], export["dim"], data["metric"])
    pairs = []
    with vdb.served(database, settings, cfg.startup_timeout_s, args.keep) as (work, endpoints):
        ctx = vdb.context(
            database,
            settings,
            endpoints,
            spec,
            data,
            metric=data["metric"],
            project_queries=data["project_queries"],
        )
        setup = sides.load_collection(ctx, cfg)
        if database == "weaviate":
            sides.set_ef(ctx, tables["query_vectors"], args.k, args.ef)
        consistency = sides.milvus_consistency(ctx) if database == "milvus" else None
        loaded = f"{setup['count']} rows loaded in {setup['upload_s']:.1f} s, index {setup['index_s']:.1f} s"
        if "compact_s" in setup:
            loaded += f", compacted {setup['compact_s']:.1f} s"
        level = f"; default consistency {consistency}" if consistency else ""
        print(
            f"\n{database} {endpoints.server_version}: collection {spec.name}, {loaded} "
            f"({setup['segments']} segment(s)){level}"
        )
        for repeat in range(args.repeats):
            pair = measure_pair(ctx, python, export, tables, args, repeat, work)
            pairs.append(pair)
            for c in args.clients:
                p, v = pair["project"][str(c)], pair["vdbbench"][str(c)]
                first = " then ".join(pair["order"][str(c)])
                print(
                    f"  [{repeat + 1}/{args.repeats}] {c} client(s) ({first}): "
                    f"project {p['qps']:7.1f} QPS p99 {p['p99_ms']:6.2f} ms | VectorDBBench {v['qps']:7.1f} "
                    f"QPS p99 {v['p99_ms']:6.2f} ms | ratio {p['qps'] / v['qps']:.2f}x  "
                    f"skew {p['start_skew_ms']:.1f} ms  load {pair['load_average'][str(c)][0]:.2f}",
                    flush=True,
                )
    return {
        "database": database,
        "server_version": endpoints.server_version,
        "collection": spec.model_dump(),
        "settings": settings.model_dump(mode="json"),
        "setup": setup,
        "consistency": consistency,
        "pairs": pairs,
    }


def main() -> None:
    args = parse_args()
    (common.OUT / "work").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"{common.cores()} cores, load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} at start")
    local = vdb.local_dataset()
    export = peer_data.export_vdbbench(local, common.OUT / "work" / f"vdbbench-{local.key}")
    python = vdbbench_venv.ensure()
    from apps.dataset.lookup import read_groundtruth, read_query_vectors
    from apps.vdb.stages.insert import work_units
    from apps.vdb.stages.query_sweep import read_queries

    base_ids, base = peer_data.read_base(local.dataset_dir)
    query_ids, query_vectors = read_queries(str(local.queries_file), None)
    gt_ids, gt = peer_data.read_groundtruth(local.groundtruth_file)
    tables = {
        "gt_ids": gt_ids,
        "gt": gt,
        "query_ids": query_ids,
        "query_vectors": query_vectors,
        "groundtruth": read_groundtruth(local.groundtruth_file),
        "queries": read_query_vectors(local.queries_file),
        "base": (base_ids, base),
    }
    data = {
        "ids": base_ids,
        "vectors": base,
        "metric": local.metric,
        "units": work_units(str(local.dataset_dir)),
        "project_queries": cycled_queries(local.queries_file, args.project_queries),
    }
    where = Path(export["dir"]).relative_to(common.REPO), python.parent.parent.relative_to(common.REPO)
    print(
        f"{export['size']} vectors x {export['dim']} ({local.label()}), {export['queries']} queries, exact "
        f"top-{export['gt_width']} ({local.metric}); VectorDBBench files in {where[0]}; its venv {where[1]}"
    )
    results = [run_database(db, python, data, export, tables, args) for db in args.databases]
    rows = peer_report.summarise(results, args)
    peer_report.report(rows, args)
    load = os.getloadavg()
    print(f"\nload average at end {load[0]:.2f} {load[1]:.2f}; {time.monotonic() - started:.0f} s in all")
    path = common.write_json(
        NAME,
        {
            "dataset": local.label(),
            "export": export,
            "k": args.k,
            "ef": args.ef,
            "duration_s": args.duration,
            "project_queries": args.project_queries,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "target": peer_report.TARGET,
            "differs": peer_report.DIFFERS,
            "vdbbench_venv": vdbbench_venv.freeze(python),
            "pins": vdbbench_venv.PINS,
            "patch": vdbbench_venv.PATCH,
            "summary": rows,
            "databases": results,
        },
    )
    print(f"raw numbers: {path}")


if __name__ == "__main__":
    main()
