"""The report's telemetry and I/O-per-query parts.

* :func:`io_table`: per query setting, recall and QPS beside the storage I/O of the database processes
  (bytes read and read calls per query, peak RSS, QPS per GB, page-cache state;
  :mod:`apps.vdb.stages.query_io`).
* :func:`telemetry_section`: from each database's ``telemetry.parquet`` (:mod:`apps.telemetry.sampler`), a
figure
  of CPU %, RSS and read bytes/s over time with the phases marked, and a table per node and process of
  mean / max CPU % and peak RSS in each phase (the study contrasts merging and non-merging workers).
  A server's children are summed into the server.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from apps.evaluate.results import ResultRows, is_ok, point_name
from apps.evaluate.rules import setting_order
from apps.report.figures import colors_for, new_figure, save_figure
from apps.telemetry.sampler import PHASES
from core.format import num, size, table

Key = tuple[str, str]  # (node, process) with children folded into their server


def io_table(run: ResultRows) -> list[str]:
    """The I/O-per-query table (empty when no query row carries I/O counters)."""
    rows = [
        r
        for db in run.databases
        for r in sorted(run.of(db, "query"), key=setting_order)
        if is_ok(r) and r.get("page_cache") is not None
    ]
    if not rows:
        return []
    header = ["database", "setting", "recall", "QPS", "page cache", "read/query", "read calls/query"]
    header += ["peak RSS", "QPS per GB", "others (cores)"]
    body = [
        [
            point_name(r),
            r["setting"] or "—",
            num(r["recall"], 3),
            num(r["qps"], 1),
            r["page_cache"],
            size(r["bytes_read_per_query"]),
            num(r["read_calls_per_query"], 2),
            size(r["peak_rss_bytes"]),
            num(r["qps_per_gb"], 1),
            num(r.get("other_cpu_cores"), 2),
        ]
        for r in rows
    ]
    note = (
        "Storage I/O of the database processes during each setting's measured window (exact counter "
        "deltas from `/proc/<pid>/io`; an in-process engine is its client process): bytes fetched from "
        "storage and read system calls per query answered, the resident-set peak, QPS per GB of it. "
        "`cold`: the page cache was dropped before the setting; `warm`: kept or not allowed. Dashes: the "
        "servers ran on other nodes. `others`: the cores that processes other than the database's and the "
        "clients' kept busy on the client's host during the window (from 0.5 on, a disturbed figure)."
    )
    return ["### Storage I/O per query", "", note, "", *table(header, body), "", *_footprint(run)]


def _footprint(run: ResultRows) -> list[str]:
    """On-disk bytes of the index and of the data, for databases whose describe() tells them apart."""
    rows = [r for db in run.databases for r in run.of(db, "index") if is_ok(r)]
    rows = [r for r in rows if r.get("index_bytes") is not None or r.get("data_bytes") is not None]
    if not rows:
        return []
    body = [
        [point_name(r), size(r["index_bytes"]), size(r["data_bytes"]), size(r["disk_bytes"])] for r in rows
    ]
    title = "On-disk footprint by kind (the databases that report their index and data apart):"
    return [title, "", *table(["database", "index", "data", "total"], body), ""]


def _read(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist() if path.is_file() else []


def _series(rows: list[dict[str, Any]]) -> dict[Key, list[dict[str, Any]]]:
    """Per (node, server) and sample time: summed CPU %, RSS and read bytes/s, with the phase."""
    by_pid: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_pid[(row["node"], row["pid"])].append(row)
    ticks: dict[Key, dict[float, dict[str, Any]]] = defaultdict(dict)
    for samples in by_pid.values():
        samples.sort(key=lambda r: r["time"])
        previous = None
        for row in samples:
            key = (row["node"], row["process"].split("/")[0])
            tick = ticks[key].setdefault(
                row["time"], {"time": row["time"], "phase": row["phase"], "cpu": None, "rss": 0, "read": 0.0}
            )
            if row["cpu_percent"] is not None:  # null: a process's first sample
                tick["cpu"] = (tick["cpu"] or 0.0) + row["cpu_percent"]
            tick["rss"] += row["rss_bytes"] or 0
            if previous is not None and row["read_bytes"] is not None and previous["read_bytes"] is not None:
                dt = row["time"] - previous["time"]
                tick["read"] += (row["read_bytes"] - previous["read_bytes"]) / dt if dt > 0 else 0.0
            previous = row
    return {key: [v[t] for t in sorted(v)] for key, v in sorted(ticks.items())}


def _phase_spans(points: list[dict[str, Any]], t0: float) -> list[tuple[str, float, float]]:
    spans: list[tuple[str, float, float]] = []
    for p in points:
        t = p["time"] - t0
        if spans and spans[-1][0] == p["phase"]:
            spans[-1] = (p["phase"], spans[-1][1], t)
        else:
            spans.append((p["phase"], t, t))
    # Each phase lasts until the next one starts.
    ends = [s[1] for s in spans[1:]] + [spans[-1][2]] if spans else []
    return [(phase, start, end) for (phase, start, _), end in zip(spans, ends, strict=True)]


def draw_telemetry(database: str, rows: list[dict[str, Any]], path: Path) -> Path | None:
    """CPU %, RSS and read bytes/s of each server (children summed) over time, phases shaded."""
    series = _series(rows)
    if not series:
        return None
    t0 = min(r["time"] for r in rows)
    figure = new_figure(8.0, 7.0)
    axes = figure.subplots(3, 1, sharex=True)
    colors = colors_for([f"{n}:{p}" for n, p in series])
    everything = sorted((p for points in series.values() for p in points), key=lambda p: p["time"])
    shades = colors_for(list(PHASES))
    for ax in axes:
        for phase, start, end in _phase_spans(everything, t0):
            ax.axvspan(start, max(end, start + 0.5), color=shades.get(phase, "grey"), alpha=0.12, lw=0)
    for phase, start, _ in _phase_spans(everything, t0):
        axes[0].text(start, 1.0, phase, transform=axes[0].get_xaxis_transform(), fontsize=7, va="bottom")
    for (node, process), points in series.items():
        xs = [p["time"] - t0 for p in points]
        label, color = f"{process} ({node})", colors[f"{node}:{process}"]
        cpu = [(x, p["cpu"]) for x, p in zip(xs, points, strict=True) if p["cpu"] is not None]
        axes[0].plot([x for x, _ in cpu], [c for _, c in cpu], color=color, label=label)
        axes[1].plot(xs, [p["rss"] / 2**20 for p in points], color=color)
        axes[2].plot(xs, [p["read"] / 2**20 for p in points], color=color)
    axes[0].set_ylabel("CPU % (100 = 1 core)")
    axes[1].set_ylabel("RSS (MiB)")
    axes[2].set_ylabel("read from storage (MiB/s)")
    axes[2].set_xlabel("seconds since deploy started")
    axes[0].legend(fontsize=7, loc="upper right")
    axes[0].set_title(f"{database}: database processes, sampled once a second", pad=14)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    return save_figure(figure, path)


def phase_summary(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Per node, server and phase: samples, mean and max CPU %, peak RSS (children summed in)."""
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for key, points in _series(rows).items():
        for p in points:
            cells[(*key, p["phase"])].append(p)

    def order(item: tuple[str, str, str]) -> tuple:
        phase = item[2]
        return (item[0], item[1], PHASES.index(phase) if phase in PHASES else len(PHASES))

    body = []
    for node, process, phase in sorted(cells, key=order):
        points = cells[(node, process, phase)]
        cpu = [p["cpu"] for p in points if p["cpu"] is not None]
        body.append(
            [
                node,
                process,
                phase,
                str(len(points)),
                num(sum(cpu) / len(cpu) if cpu else None, 1),
                num(max(cpu) if cpu else None, 1),
                size(max(p["rss"] for p in points)),
            ]
        )
    return body


def telemetry_section(telemetry: dict[str, Path], out: Path) -> tuple[list[str], dict[str, Path]]:
    """The report's telemetry section and figures from ``{database: telemetry.parquet}``."""
    lines = ["## Telemetry", ""]
    lines.append(
        "Each database process (a local server with its children, or the client process running an "
        "in-process engine) sampled once a second: CPU % (100 = one core), resident memory and bytes "
        "read from storage. Network counters in `telemetry.parquet` are the node's, not the process's. "
        "On HPC each rank samples its server beside it and the rows are merged here by time."
    )
    lines.append("")
    figures: dict[str, Path] = {}
    header = ["node", "process", "phase", "samples", "mean CPU %", "max CPU %", "peak RSS"]
    for database, path in sorted(telemetry.items()):
        rows = _read(path)
        body = phase_summary(rows)
        if not body:
            lines += [f"_{database}: no telemetry samples._", ""]
            continue
        lines += [f"### {database}", "", *table(header, body), ""]
        figure = draw_telemetry(database, rows, out / f"telemetry_{database}.png")
        if figure is not None:
            figures[f"telemetry_{database}"] = figure
            lines += [f"![{database}: CPU, memory and reads per phase]({figure.name})", ""]
    return lines, figures
