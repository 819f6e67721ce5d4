"""The summary and report of ``benchmarks.peer_vectordbbench``: medians per database and client count,
the printed table, and what differs between the two sides."""

from __future__ import annotations

import statistics
from importlib.metadata import version
from typing import Any

TARGET = 1.0
RECALL_SLACK = 0.001  # the project's recall may be this much lower (plain recall, same definition) and pass
DIFFERS = {
    "weaviate": [
        f"client: project weaviate-client {version('weaviate-client')} over gRPC "
        "(collection.query.near_vector, distance only); "
        "VectorDBBench weaviate-client 3.26 over REST: a schema GET (client.schema.exists) then a GraphQL "
        "Get with nearVector returning the 'key' property, per query",
        "collection: its 'key' property (the row id, which VectorDBBench returns) is a number, not "
        "VectorDBBench's int: GraphQL's Int is 32-bit and Weaviate answers null for ids >= 2**31",
        "ef: Weaviate keeps it in the collection; set to --ef once by the project's client and checked "
        "before every VectorDBBench run (its search-only path sets none: its optimize step would)",
    ],
    "milvus": [
        f"client: project pymilvus {version('pymilvus')}: the SearchRequest pymilvus prepares, built once "
        "per setting, each query's float32 bytes swapped in and sent on pymilvus's own stub "
        "(byte-identical to MilvusClient.search's request; consistency level Bounded, named); "
        "VectorDBBench pymilvus 2.6.17 MilvusClient.search, a list of floats too (no consistency level: the "
        "collection's default), "
        "with the 'pk' default patched in (see vdbbench_venv.py); both gRPC, ids and distances only",
    ],
    "both": [
        "queries: project sends its query set cycled to --project-queries queries once, split over its "
        "client processes, after --warmup warm-up queries each; VectorDBBench's processes each cycle the "
        "whole test set from a random offset for --duration s, without warm-up",
        "clock: both start their clients together after every one is ready: VectorDBBench's processes wait "
        "on a Condition, then connect and search for --duration s; the project's clients connect and warm "
        "up, then all start at one instant (measured start skew: 'skew' per repeat above). Project QPS = "
        "queries / (last answer - first request) from its raw rows (apps.evaluate.metrics.qps; the slower "
        "client ends it: the QPS while every client ran is in the JSON); VectorDBBench QPS = queries / "
        "(start signal -> every process returned; its processes connect after the signal and stop on "
        "time); p99 over each side's own requests",
        "recall: VectorDBBench's from its serial pass; project's from the first k ids of its rows; both "
        "|returned & exact top-k| / k against the same ground truth (tie-aware recall in the JSON)",
    ],
}


def summarise(results: list[dict[str, Any]], args: Any) -> list[dict[str, Any]]:
    rows = []
    for result in results:
        pairs = result["pairs"]
        for c in map(str, args.clients):

            def med(side: str, key: str, c: str = c, pairs: list = pairs) -> float:
                return statistics.median(p[side][c][key] for p in pairs)

            ratio = statistics.median(p["project"][c]["qps"] / p["vdbbench"][c]["qps"] for p in pairs)
            recall_p = statistics.median(p["project"][c]["recall"] for p in pairs)
            recall_v = med("vdbbench", "recall")
            rows.append(
                {
                    "database": result["database"],
                    "clients": int(c),
                    "n": len(pairs),
                    "project_qps": med("project", "qps"),
                    "vdbbench_qps": med("vdbbench", "qps"),
                    "ratio": ratio,
                    "ratio_per_repeat": [
                        round(p["project"][c]["qps"] / p["vdbbench"][c]["qps"], 3) for p in pairs
                    ],
                    "project_p99_ms": med("project", "p99_ms"),
                    "vdbbench_p99_ms": med("vdbbench", "p99_ms"),
                    "project_recall": recall_p,
                    "vdbbench_recall": recall_v,
                    "project_recall_tie_aware": statistics.median(
                        p["project"][c]["recall_tie_aware"] for p in pairs
                    ),
                    "vdbbench_recall_tie_aware": statistics.median(
                        p["vdbbench"][c]["recall_tie_aware"] for p in pairs
                    ),
                    "project_queries": med("project", "queries"),
                    "project_qps_common_window": med("project", "qps_common_window"),
                    "project_start_skew_ms": med("project", "start_skew_ms"),
                    "project_end_skew_ms": med("project", "end_skew_ms"),
                    "project_seconds": med("project", "seconds"),
                    "vdbbench_queries": med("vdbbench", "queries"),
                    "vdbbench_seconds": med("vdbbench", "seconds"),
                    "vdbbench_recall_queries": pairs[0]["vdbbench"][c]["serial_queries"],
                    "same_ids": min(p["project"][c]["same_ids"] for p in pairs),
                    "met": ratio >= TARGET and recall_p >= recall_v - RECALL_SLACK,
                }
            )
    return rows


def report(rows: list[dict[str, Any]], args: Any) -> None:
    print(
        f"\npeer: project query stage vs VectorDBBench 2.0, same server and collection, k={args.k}, "
        f"ef={args.ef}, batch 1 (median of {args.repeats})\n"
    )
    header = (
        f"{'database':<9}{'cl':>3}{'proj QPS':>10}{'VDBB QPS':>10}{'ratio':>7}{'p99 proj':>10}"
        f"{'p99 VDBB':>10}{'rec proj':>9}{'rec VDBB':>9}{'same ids':>9}  {'queries/s proj':>15}"
        f"{'queries/s VDBB':>16}  target"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        verdict = "MET" if r["met"] else "NOT MET"
        print(
            f"{r['database']:<9}{r['clients']:>3}{r['project_qps']:10.1f}{r['vdbbench_qps']:10.1f}"
            f"{r['ratio']:6.2f}x{r['project_p99_ms']:8.2f}ms{r['vdbbench_p99_ms']:8.2f}ms"
            f"{r['project_recall']:9.4f}{r['vdbbench_recall']:9.4f}{r['same_ids']:9.0%}  "
            f"{r['project_queries']:>7.0f}/{r['project_seconds']:5.1f}s"
            f"{r['vdbbench_queries']:>8.0f}/{r['vdbbench_seconds']:5.1f}s  {verdict} (>= {TARGET}x)"
        )
    print(
        "\nratio = median over repeats of project QPS / VectorDBBench QPS of the same pair; MET also needs "
        f"the project's recall >= VectorDBBench's - {RECALL_SLACK}. queries/s = queries and seconds each QPS "
        "and p99 rest on (medians); VectorDBBench's recall rests on its "
        "serial pass over "
        f"{rows[0]['vdbbench_recall_queries']} test queries, checked against a recomputation from the ids "
        "its search_embedding returned. same ids = share of test queries whose k ids are identical on both "
        "sides (worst repeat)."
    )
    print("\nwhat differs between the two sides (same server, collection, queries, ground truth, k, ef):")
    for database in ("both", *args.databases):
        for line in DIFFERS[database]:
            print(f"  - {database}: {line}")
