"""Peak memory of a pipeline run on 1x versus 10x the corpus (streaming: must stay within 1.2x).

Each scale is a real ``python -m pipeline run`` with a generated configuration (``configs/local.yaml``'s
model and embedding settings, the same shard size at both scales, a limited query set) in its own
temporary work directory. The 10x corpus is the 1x sample repeated ten times, ids made unique
(``<id>-r<k>``). RSS is summed over the whole process tree (driver + Parsl interchange + worker pool +
workers) every 0.2 s with psutil; this process becomes a child subreaper so the worker pool, which Parsl's
LocalProvider starts from a shell that exits, stays in the tree.

Besides the total, the peak is broken down by process role and by stage: each task record in the run's
``provenance.json`` names its worker pid and start/end, so the peak RSS of the worker while it ran a
task of stage S is the memory that stage S needed. The ratios of those figures show which part grows.

    .venv/bin/python -m benchmarks.memory                      # 200 -> 2,000 documents, ~8 minutes
    .venv/bin/python -m benchmarks.memory --docs 100 --factor 10 --chunking none
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common

NAME = "memory"
TARGET = 1.2


def run_pipeline(scale: int, args: argparse.Namespace) -> dict[str, Any]:
    """One ``python -m pipeline run`` on ``scale`` x the corpus; peak RSS by process role and stage."""
    work = Path(tempfile.mkdtemp(prefix=f"memory-{scale}x-", dir=common.OUT / "work"))
    try:
        corpus = common.write_corpus(work / "corpus" / "corpus.jsonl", args.docs, repeat=scale)
        chunking = {"method": "none"} if args.chunking == "none" else None  # None: configs/local.yaml's
        config = common.make_config(
            corpus,
            work,
            name=f"memory-{scale}x",
            docs_per_shard=args.docs_per_shard,
            chunking=chunking,
            token_budget=args.token_budget,
            workers=args.workers,
            queries=args.queries,
            k=args.k,
            memory_budget_mb=args.memory_budget_mb,
        )
        config_file = common.write_config(config, work / "config.yaml")
        env = {**os.environ, "COLUMNS": "160"}
        started = time.time()
        child = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "run", str(config_file)],
            cwd=common.REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        with common.TreeSampler(
            interval=args.interval, own_children=[child.pid], include_root=False, reap=True
        ) as s:
            output, _ = child.communicate()
        seconds = time.time() - started
        if child.returncode != 0:
            raise SystemExit(f"pipeline run at {scale}x failed (exit {child.returncode}):\n{output[-4000:]}")
        provenance = json.loads(next((work / "runs").glob("*/provenance.json")).read_text())
        return {
            "scale": scale,
            "documents": args.docs * scale,
            "seconds": seconds,
            "samples": len(s.timeline),
            "peak_rss_mib": common.mib(s.peak),
            "peak_processes": s.peak_processes,
            "peak_breakdown": s.peak_breakdown,
            "by_role": peak_by_role(s.timeline),
            "by_stage": peak_by_stage(s.timeline, provenance, args.interval),
            "rows": {name: stage_rows(stage) for name, stage in provenance["stages"].items()},
        }
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def stage_rows(stage: dict[str, Any]) -> int:
    return sum(int(o.get("rows") or 0) for o in stage.get("outputs", []))


def peak_by_role(timeline: list) -> dict[str, float]:
    """Peak MiB per role: summed over the role's processes, and for workers also the largest one."""
    peaks: dict[str, float] = {}
    for _, rows in timeline:
        sums: dict[str, int] = {}
        for _, role, rss in rows:
            sums[role] = sums.get(role, 0) + rss
            if role == "parsl worker":
                peaks["largest parsl worker"] = max(peaks.get("largest parsl worker", 0), common.mib(rss))
        for role, total in sums.items():
            peaks[role] = max(peaks.get(role, 0), common.mib(total))
    return {role: round(value, 1) for role, value in sorted(peaks.items())}


def peak_by_stage(timeline: list, provenance: dict[str, Any], interval: float) -> dict[str, dict[str, float]]:
    """Per stage: the largest RSS of a worker while it ran one of the stage's tasks.

    Task records carry the worker's pid and start/end; the window is widened by one sampling interval so
    that tasks shorter than the interval are still seen. Stages whose records carry no pid (shard) or
    that were cached are left out.
    """
    out: dict[str, dict[str, float]] = {}
    for name, stage in provenance["stages"].items():
        tasks = [t for t in stage.get("tasks", []) if t.get("pid") and t.get("started")]
        if stage.get("cached") or not tasks:
            continue
        peak = 0
        for task in tasks:
            t0, t1 = task["started"] - interval, task["finished"] + interval
            for when, rows in timeline:
                if t0 <= when <= t1:
                    peak = max(peak, sum(rss for pid, _, rss in rows if pid == task["pid"]))
        out[name] = {"tasks": len(tasks), "worker_peak_mib": round(common.mib(peak), 1)}
    return out


def ratio(a: float, b: float) -> float:
    return b / a if a else float("nan")


def fmt_ratio(a: float, b: float) -> str:
    """``b / a`` as ``1.04x``, or ``n/a`` when the 1x figure is zero (a process seen only at 10x)."""
    return f"{b / a:>7.2f}x" if a else f"{'n/a':>8}"


def report(small: dict[str, Any], large: dict[str, Any]) -> None:
    """Print the two runs side by side with the ratio of every figure."""
    f = large["scale"]
    print(
        f"\n{'':<34}{'1x':>10}{f'{f}x':>10}{'ratio':>8}\n"
        f"{'documents':<34}{small['documents']:>10,}{large['documents']:>10,}"
        f"{ratio(small['documents'], large['documents']):>7.1f}x"
    )
    for name in ("chunk", "embed"):
        a, b = small["rows"].get(name, 0), large["rows"].get(name, 0)
        print(f"{name + ' rows':<34}{a:>10,}{b:>10,}{ratio(a, b):>7.1f}x")
    print(
        f"{'wall time (s)':<34}{small['seconds']:>10.0f}{large['seconds']:>10.0f}"
        f"{ratio(small['seconds'], large['seconds']):>7.1f}x"
    )
    print(
        f"{'PEAK RSS, whole tree (MiB)':<34}{small['peak_rss_mib']:>10.0f}{large['peak_rss_mib']:>10.0f}"
        f"{ratio(small['peak_rss_mib'], large['peak_rss_mib']):>7.2f}x"
    )
    print("peak RSS by process role (MiB):")
    for role in sorted(set(small["by_role"]) | set(large["by_role"])):
        a, b = small["by_role"].get(role, 0), large["by_role"].get(role, 0)
        print(f"  {role:<32}{a:>10.0f}{b:>10.0f}{fmt_ratio(a, b)}")
    print("peak RSS of the worker while running a task of the stage (MiB):")
    for stage, a in small["by_stage"].items():
        b = large["by_stage"].get(stage)
        if b:
            label = f"{stage} ({a['tasks']} -> {b['tasks']} tasks)"
            a_mib, b_mib = a["worker_peak_mib"], b["worker_peak_mib"]
            print(f"  {label:<32}{a_mib:>10.0f}{b_mib:>10.0f}{fmt_ratio(a_mib, b_mib)}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=200, help="documents at 1x (default 200)")
    parser.add_argument("--factor", type=int, default=10, help="the large run's multiple (default 10)")
    parser.add_argument("--docs-per-shard", type=int, default=25, help="same at both scales (25)")
    parser.add_argument(
        "--chunking", choices=["local", "none"], default="local", help="configs/local.yaml's, or none"
    )
    parser.add_argument("--queries", type=int, default=100, help="term queries (default 100)")
    parser.add_argument("--k", type=int, default=100, help="ground-truth neighbours (100)")
    parser.add_argument("--workers", type=int, default=2, help="Parsl workers (2)")
    parser.add_argument("--token-budget", type=int, default=None, help="default: configs/local.yaml's")
    parser.add_argument("--memory-budget-mb", type=int, default=256, help="ground truth, as local.yaml")
    parser.add_argument("--interval", type=float, default=0.2, help="sampling interval, seconds (0.2)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary work directories")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if not common.become_subreaper():
        print("warning: not Linux; Parsl's worker pool may escape the sampled process tree")
    (common.OUT / "work").mkdir(parents=True, exist_ok=True)
    chunking = "configs/local.yaml's" if args.chunking == "local" else "no"
    print(
        f"pipeline run on {args.docs} and {args.docs * args.factor} documents ({chunking} chunking, "
        f"{args.docs_per_shard} documents per shard, {args.queries} queries, k={args.k}, {args.workers} "
        f"workers); RSS summed over the process tree every {args.interval} s"
    )
    runs = []
    for scale in (1, args.factor):
        result = run_pipeline(scale, args)
        runs.append(result)
        print(
            f"  {scale:>2}x: {result['documents']:,} documents, {result['rows'].get('embed', 0):,} vectors, "
            f"{result['seconds']:.0f} s, peak RSS {result['peak_rss_mib']:.0f} MiB "
            f"(sum of {result['peak_processes']} processes)"
        )
    small, large = runs
    report(small, large)
    growth = large["peak_rss_mib"] / small["peak_rss_mib"]
    met = growth <= TARGET
    print(
        f"\nmemory: peak RSS {large['peak_rss_mib']:.0f} MiB at {args.factor}x vs "
        f"{small['peak_rss_mib']:.0f} MiB at 1x = {growth:.2f}x (target <= {TARGET}x): "
        f"{'MET' if met else 'NOT MET'}"
    )
    path = common.write_json(
        NAME, {"runs": runs, "ratio": growth, "target": TARGET, "target_sense": "<=", "met": met}
    )
    print(f"raw numbers: {path}")


if __name__ == "__main__":
    main()
