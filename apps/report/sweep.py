"""Sweeps in the report: the points listed, and each point's repeats folded into their median with the spread.

``results.parquet`` keeps one row per point × stage × setting × repeat; the report's tables and figures
show one row per point × stage × setting: the median over its repeats (:func:`combine_repeats`), and a
``Repeats`` section gives, for every repeated measurement, how many repeats it rests on and the median
with the min–max range of each headline metric (:func:`repeats_section`). A run without repeats reads
exactly as before (nothing is folded, no section is written).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from apps.evaluate.results import is_ok, point_name
from apps.evaluate.rules import spread
from apps.report.format import median_range
from core.format import table

# The metrics folded per stage (their median over repeats), and the ones the Repeats table shows.
FOLDED = {
    "deploy": ("deploy_s",),
    "insert": ("upload_s", "searchable_s", "insert_vectors_per_s"),
    "index": ("index_s", "disk_bytes", "write_amplification", "segments"),
    "query": (
        "qps",
        "latency_mean_ms",
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "recall",
        "recall_min",
        # what the figures rest on and the I/O per query, so a folded row describes its medians
        "window_s",
        "queries_sent",
        "requests",
        "bytes_read_per_query",
        "read_calls_per_query",
        "peak_rss_bytes",
        "qps_per_gb",
        "other_cpu_cores",
    ),
}
SHOWN = {
    "deploy": ("deploy_s",),
    "insert": ("insert_vectors_per_s", "upload_s"),
    "index": ("index_s",),
    "query": ("qps", "p99_ms", "recall"),
}
INTEGER = {"disk_bytes", "segments"}


def _group_key(row: dict[str, Any]) -> tuple:
    return (point_name(row), row["stage"], row["setting"])


def combine_repeats(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[tuple, dict]]:
    """(rows with each repeated ok measurement folded into its median, spreads by (name, stage, setting)).

    A spread is ``{"repeats": n, metric: Spread(median, min, max), ...}``; only groups measured more than once
    have one. Failed and stalled rows are kept as they are (a failure in one repeat stays visible).
    """
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        if is_ok(row) and not row.get("stalled") and row.get("repeat") is not None:
            groups.setdefault(_group_key(row), []).append(row)
    folded: list[dict[str, Any]] = []
    spreads: dict[tuple, dict] = {}
    emitted: set[tuple] = set()
    for row in rows:
        key = _group_key(row)
        members = groups.get(key) if is_ok(row) and not row.get("stalled") else None
        if not members or len(members) == 1:
            folded.append(row)
            continue
        if key in emitted:
            continue
        emitted.add(key)
        median_row = dict(members[0])
        found: dict[str, Any] = {"repeats": len(members)}
        for metric in FOLDED.get(row["stage"], ()):
            over = spread([m[metric] for m in members if m.get(metric) is not None])
            if over is None:
                continue
            median_row[metric] = round(over.median) if metric in INTEGER else over.median
            found[metric] = over
        median_row["repeat"] = None
        spreads[key] = found
        folded.append(median_row)
    return folded, spreads


def repeats_section(spreads: dict[tuple, dict]) -> list[str]:
    """Markdown lines of the Repeats section ([] when nothing was repeated)."""
    if not spreads:
        return []
    lines = [
        "## Repeats",
        "",
        "Each repeated point was deployed, loaded, indexed and queried again from scratch; the tables "
        "above show the median over its repeats, here with the range: median (min–max).",
        "",
    ]
    body = [
        [name, stage, setting or "—", str(found["repeats"]), metric, median_range(found[metric])]
        for (name, stage, setting), found in sorted(
            spreads.items(), key=lambda kv: tuple(str(k) for k in kv[0])
        )
        for metric in SHOWN.get(stage, ())
        if metric in found
    ]
    header = ["point", "stage", "setting", "repeats", "metric", "median (min–max)"]
    return [*lines, *table(header, body), ""]


def points_section(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown lines listing the sweep's points: label, database, swept values, repeats ([] unswept)."""
    points: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.get("label") is None:
            continue
        point = points.setdefault(row["label"], {"database": row["database"], "sweep": {}, "repeats": set()})
        point["sweep"].update(row.get("sweep") or {})
        if row.get("repeat") is not None:
            point["repeats"].add(row["repeat"])
    if not any(p["sweep"] or name != p["database"] or len(p["repeats"]) > 1 for name, p in points.items()):
        return []
    body = []
    for name, point in points.items():
        params = ", ".join(f"{k}={v}" for k, v in point["sweep"].items()) or "—"
        body.append([name, point["database"], params, str(len(point["repeats"]) or 1)])
    return ["## Sweep points", "", *table(["point", "database", "parameters", "repeats"], body), ""]
