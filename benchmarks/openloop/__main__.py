"""The open-loop generator on a local server: its own lag against offered rate, and the knee's repeatability.

One server (default Milvus, settings of ``configs/local.yaml``) is loaded and indexed by the project's own
stages (untimed). Then, with ``--clients`` client processes, ef 64, batch 1, k 10:

* **closed loop** (the peer): the query stage's closed-loop setting for ``--seconds``; its request rate is
  what the open loop is compared with;
* **lag**: open-loop settings offered at 20%, 50% and 80% of that rate (Poisson arrivals); per rate the
  generator's lag P99 (how late a free client sent; target ≤ 1 ms), achieved / offered and the P99 from
  intended send time;
* **knee**: ``rate: auto`` with ``--bound-ms`` as the P99 bound, ``--repeats`` times (each with its own
  closed-loop setting first); the knee of each repeat (the highest rate served), and its spread around the
  median (target within ±10%).

The figures come from the raw requests the stage wrote (``apps.vdb.stages.open_loop.open_loop_stats``).
The vectors are the project's dataset when built, else seeded random unit vectors (synthetic; said so).

    .venv/bin/python -m benchmarks.openloop                     # Milvus, 4 clients, about 3 minutes
    .venv/bin/python -m benchmarks.openloop --database weaviate --clients 2 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any

import pyarrow.parquet as pq

from benchmarks import common
from benchmarks.common import vdb

NAME = "openloop"
LAG_TARGET_MS = 1.0
KNEE_SPREAD = 0.10
COLLECTION = "openloop_bench"
DEFAULT_ROWS = 10_000


def figures(records: list[Any]) -> list[dict[str, Any]]:
    """Per open-loop record: its figures from its requests file and the schedule in its metadata."""
    from apps.vdb.stages.open_loop import open_loop_stats
    from apps.vdb.stages.query_raw import OPEN_LOOP_META, read_requests

    rows = []
    for record in records:
        meta = pq.read_schema(record.file).metadata or {}
        if OPEN_LOOP_META.encode() not in meta:
            continue
        schedule = json.loads(meta[OPEN_LOOP_META.encode()])
        if record.stalled:
            rows.append(
                {"stage": "open_loop", "status": "failed", "rate": schedule["rate"], "why": record.stalled}
            )
            continue
        stats = open_loop_stats(
            read_requests(record.file),
            schedule["rate"],
            schedule["scheduled"],
            schedule["duration_s"],
            schedule["max_lag_ms"],
        )
        rows.append({"stage": "open_loop", "status": "ok", **stats})
    return rows


def closed_rate(record: Any) -> float:
    from apps.vdb.stages.query_raw import read_requests

    every = read_requests(record.file)
    start, end = every.column("t_start").to_numpy(), every.column("t_end").to_numpy()
    return every.num_rows / float(end.max() - start.min())


def main() -> None:
    from apps.evaluate.rules import knee
    from apps.vdb.config import QuerySweepConfig
    from apps.vdb.stages.query_sweep import query_sweep

    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="milvus", help="a database with a local server (milvus)")
    parser.add_argument("--clients", type=int, default=4, help="client processes (4)")
    parser.add_argument("--seconds", type=float, default=4.0, help="window of each setting (4 s)")
    parser.add_argument("--bound-ms", type=float, default=20.0, help="the knee's P99 bound (20 ms)")
    parser.add_argument("--repeats", type=int, default=3, help="knee searches (3)")
    parser.add_argument("--rows", type=int, default=None, help="first N dataset rows (default all)")
    args = parser.parse_args()
    (common.OUT / "work").mkdir(parents=True, exist_ok=True)
    cfg = vdb.vdb_config()
    data = vdb.bench_dataset(args.rows, DEFAULT_ROWS)
    queries = vdb.bench_queries(data["vectors"].shape[1])
    load = os.getloadavg()
    print(
        f"{len(data['ids'])} vectors x {data['vectors'].shape[1]} from {data['label']}; "
        f"{args.clients} clients, {args.seconds:g} s per setting; {common.cores()} cores, "
        f"load average {load[0]:.2f}",
        flush=True,
    )
    settings = vdb.settings_for(args.database, cfg)
    spec = vdb.collection_spec(cfg, COLLECTION, data["vectors"].shape[1], data["metric"])
    base = {"ef": [64], "batch_size": [1], "clients": [args.clients], "k": [10], "duration_s": args.seconds}
    with vdb.served(args.database, settings, cfg.startup_timeout_s, False) as (work, endpoints):
        ctx = vdb.context(args.database, settings, endpoints, spec, data)
        vdb.load_collection(ctx, cfg)
        target = vdb.target_of(ctx)

        def sweep(name: str, **query: Any) -> list[Any]:
            return query_sweep(
                target, str(queries), QuerySweepConfig(**base, **query), str(work / name), None
            )

        [closed] = sweep("closed")
        peer = closed_rate(closed)
        print(f"closed loop: {peer:,.0f} requests/s", flush=True)
        shares = (0.2, 0.5, 0.8)
        lag_rows = figures(sweep("lag", rate=[round(s * peer, 1) for s in shares], max_lag_ms=1e9)[1:])
        for share, row in zip(shares, lag_rows, strict=True):
            row["share"] = share
            if row["status"] != "ok":
                print(f"  offered {row['rate']:8,.0f}/s ({share:.0%} of closed): not run: {row['why']}")
                continue
            print(
                f"  offered {row['rate']:8,.0f}/s ({share:.0%} of closed): achieved/offered "
                f"{row['achieved_rate'] / row['offered_rate']:.3f}, lag P99 {row['lag_p99_ms']:.3f} ms, "
                f"P99 {row['intended_p99_ms']:.2f} ms (service {row['p99_ms']:.2f} ms), busiest client "
                f"{row['client_busy']:.0%}",
                flush=True,
            )
        knees = []
        for repeat in range(args.repeats):
            records = sweep(f"knee-{repeat}", rate="auto", p99_bound_ms=args.bound_ms)
            rows = figures(records[1:])
            best = knee(rows, args.bound_ms)
            closed_now = closed_rate(records[0])
            knees.append({"knee": best and best["rate"], "closed": closed_now, "steps": rows})
            print(
                f"  knee search {repeat + 1}/{args.repeats}: closed {closed_now:,.0f}/s, steps "
                f"{[round(r['rate']) for r in rows]}, knee {best['rate'] if best else 'none'}",
                flush=True,
            )
    lag_ok = all(r["status"] == "ok" and r["lag_p99_ms"] <= LAG_TARGET_MS for r in lag_rows)
    values = [k["knee"] for k in knees if k["knee"]]
    median = statistics.median(values) if values else float("nan")
    spread = max(abs(v - median) / median for v in values) if values else float("nan")
    knee_ok = len(values) == len(knees) and spread <= KNEE_SPREAD
    print(
        f"\nopen loop on {args.database} (load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f})"
    )
    lags = [format(r["lag_p99_ms"], ".3f") if r["status"] == "ok" else "not run" for r in lag_rows]
    print(
        f"generator lag P99 at 20/50/80% of the closed-loop rate: {', '.join(lags)} ms  "
        f"{'MET' if lag_ok else 'NOT MET'} (<= {LAG_TARGET_MS} ms)"
    )
    print(
        f"knee over {len(knees)} repeats: {values} requests/s, median {median:,.0f} = "
        f"{median / peer:.2f}x the closed-loop rate; spread ±{spread:.1%}  "
        f"{'MET' if knee_ok else 'NOT MET'} (within ±{KNEE_SPREAD:.0%})"
    )
    path = common.write_json(
        NAME,
        {
            "database": args.database,
            "dataset": data["label"],
            "clients": args.clients,
            "seconds": args.seconds,
            "bound_ms": args.bound_ms,
            "closed_rate": peer,
            "lag": lag_rows,
            "knees": knees,
            "lag_met": lag_ok,
            "knee_met": knee_ok,
        },
    )
    print(f"raw numbers: {path}")


if __name__ == "__main__":
    main()
