"""The report's PNG figures, drawn on matplotlib's Agg canvas (no pyplot global state).

The recall–QPS frontier, insert throughput versus batch size and the latency percentiles at each
database's operating point. A figure without data is not drawn (``None``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from apps.evaluate.results import ResultRows, insert_rate, is_ok, sent_size
from apps.evaluate.rules import MIN_RECALL, best_operating_point, operating_point


def new_figure(width: float = 7.0, height: float = 4.6):
    """A matplotlib Figure on the Agg canvas (no display, no pyplot state), ``width`` x ``height`` inches."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(figure)
    return figure


# Past this many series (points of a run across engines) a figure puts its legend beside the axes, one
# entry per series, and labels best points by the star only (the tables name their settings).
MANY = 6
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")


def colors_for(databases: Sequence[str]) -> dict[str, Any]:
    """One colour per name, stable in the given order (tab10, or tab20 beyond ten names)."""
    from matplotlib import colormaps

    palette = colormaps["tab10" if len(databases) <= 10 else "tab20"].colors
    return {db: palette[i % len(palette)] for i, db in enumerate(databases)}


def _marker(databases: Sequence[str], db: str) -> str:
    """A marker per series, so that two series of similar colour stay apart."""
    return MARKERS[list(databases).index(db) % len(MARKERS)] if len(databases) > MANY else "o"


def _series_figure(count: int, height: float = 4.6):
    """A figure for ``count`` series: wider when the legend goes beside the axes."""
    return new_figure(width=9.5 if count > MANY else 7.0, height=height)


def save_figure(figure: Any, path: Path) -> Path:
    """Write ``figure`` as a PNG at ``path`` atomically (temp file + rename), without a software stamp."""
    figure.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    figure.savefig(tmp, format="png", metadata={"Software": None})
    tmp.replace(path)
    return path


def finish_axes(axes: Any, xlabel: str, ylabel: str, title: str, entries: int = 0) -> None:
    """Axis labels, title, a light grid and the legend of a line/scatter figure (beside the axes when it
    has more than MANY ``entries``)."""
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    if not axes.get_legend_handles_labels()[0]:
        return  # nothing drawn (every series invalid): no legend to show
    if entries > MANY:
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        axes.legend(fontsize=7, loc="best")


def pareto_frontier(points: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """(recall, qps) points that no other point beats on both; sorted by recall ascending."""
    frontier: list[tuple[float, float]] = []
    best_qps = -math.inf
    for recall, q in sorted(points, key=lambda p: (-p[0], -p[1])):
        if q > best_qps:
            frontier.append((recall, q))
            best_qps = q
    return frontier[::-1]


def _plot_recall_qps(run: ResultRows, colors: dict[str, Any], path: Path) -> Path | None:
    series = {
        db: [(r["recall"], r["qps"], r) for r in run.queries(db) if r["recall"] is not None and r["qps"]]
        for db in run.databases
    }
    if not any(series.values()):
        return None
    drawn = [db for db, points in series.items() if points]
    many = len(drawn) > MANY
    figure = _series_figure(len(drawn))
    axes = figure.add_subplot()
    all_qps = []
    for db, points in series.items():
        if not points:
            continue
        color, marker = colors[db], _marker(drawn, db)
        recalls = [p[0] for p in points]
        rates = [p[1] for p in points]
        all_qps += rates
        axes.scatter(
            recalls,
            rates,
            color=color,
            marker=marker,
            alpha=0.45,
            s=22,
            label=None if many else f"{db}: all settings",
        )
        frontier = pareto_frontier(zip(recalls, rates, strict=True))
        axes.plot(
            [f[0] for f in frontier],
            [f[1] for f in frontier],
            "-",
            marker=marker,
            color=color,
            ms=4,
            label=db if many else f"{db}: Pareto frontier",
        )
        best = best_operating_point([p[2] for p in points], MIN_RECALL)
        if best is not None:
            axes.scatter(
                [best["recall"]], [best["qps"]], marker="*", s=220, color=color, edgecolor="black", zorder=5
            )
            if many:  # fifteen setting names would cover the curves: the tables name them
                continue
            axes.annotate(
                best["setting"] or "",
                (best["recall"], best["qps"]),
                textcoords="offset points",
                xytext=(-8, 8),
                ha="right",
                fontsize=7,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "alpha": 0.85, "lw": 0},
            )
    axes.axvline(MIN_RECALL, color="grey", ls="--", lw=1)
    axes.text(
        MIN_RECALL,
        1.0,
        f" recall {MIN_RECALL}",
        transform=axes.get_xaxis_transform(),
        va="top",
        fontsize=8,
        color="grey",
    )
    if all_qps and max(all_qps) / max(min(all_qps), 1e-12) > 20:
        axes.set_yscale("log")
    title = f"Recall versus QPS (★ best QPS at recall ≥ {MIN_RECALL})"
    if many:
        title = f"Recall versus QPS: each point's Pareto frontier (★ best QPS at recall ≥ {MIN_RECALL})"
    finish_axes(axes, "recall@k (tie-aware)", "QPS (queries / s)", title, len(drawn))
    return save_figure(figure, path)


def _plot_insert(run: ResultRows, colors: dict[str, Any], path: Path) -> Path | None:
    """Throughput per configured batch size; a point whose requests were smaller says what was sent."""
    groups: dict[tuple[str, Any], list[tuple[int, float, int | None]]] = {}
    for db in run.databases:
        for row in run.of(db, "insert"):
            rate = insert_rate(row)
            if is_ok(row) and row["batch_size"] and rate:
                point = (row["batch_size"], rate, sent_size(row))
                groups.setdefault((db, row["clients"]), []).append(point)
    if not groups:
        return None
    figure = _series_figure(len(groups))
    axes = figure.add_subplot()
    styles = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]
    clients_seen = sorted({c for _, c in groups if c is not None})
    batches = set()
    for (db, clients), points in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1] or 0)):
        points.sort(key=lambda p: p[0])
        batches.update(p[0] for p in points)
        style, marker = (
            styles[clients_seen.index(clients) % len(styles)] if clients is not None else styles[0]
        )
        label = db if clients is None else f"{db}, {clients} client{'s' if clients != 1 else ''}"
        axes.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            style,
            marker=marker,
            color=colors[db],
            label=label,
        )
        for batch, rate, sent in points:
            if sent is not None:  # the database capped its request size: say what was really sent
                axes.annotate(
                    f"sent {sent}/request",
                    (batch, rate),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=7,
                )
    if len(batches) > 1:
        axes.set_xscale("log", base=2)
    rates = [p[1] for points in groups.values() for p in points]
    if max(rates) / max(min(rates), 1e-12) > 20:  # in-process engines append far faster than servers
        axes.set_yscale("log")
    axes.set_xticks(sorted(batches), [str(b) for b in sorted(batches)])
    capped = any(p[2] is not None for points in groups.values() for p in points)
    xlabel = (
        "insert batch size (vectors per batch; annotated where requests were smaller)"
        if capped
        else "insert batch size (vectors per request)"
    )
    title = "Insert throughput versus batch size"
    finish_axes(axes, xlabel, "insert throughput (vectors / s)", title, len(groups))
    return save_figure(figure, path)


def _varying(settings: Sequence[str]) -> Any:
    """A function shortening a setting ("ef=64,batch=32,clients=1,k=10") to the parts that differ among
    ``settings`` (ef alone when none does)."""
    parts = [dict(p.split("=", 1) for p in s.split(",") if "=" in p) for s in settings]
    keys = [k for k in (parts[0] if parts else {}) if len({p.get(k) for p in parts}) > 1] or ["ef"]

    def shorten(setting: str) -> str:
        found = dict(p.split("=", 1) for p in setting.split(",") if "=" in p)
        return ",".join(f"{k}={found[k]}" for k in keys if k in found) or setting

    return shorten


def _plot_latency(run: ResultRows, colors: dict[str, Any], path: Path) -> Path | None:
    chosen = []
    for db in run.databases:
        row, is_best = operating_point(run.queries(db))
        if row is not None and row["latency_mean_ms"] is not None:
            chosen.append((db, row, is_best))
    if not chosen:
        return None
    many = len(chosen) > MANY
    figure = new_figure(width=max(7.0, 0.62 * len(chosen) + 1.5), height=5.6 if many else 4.6)
    axes = figure.add_subplot()
    stats = [("latency_mean_ms", "mean"), ("p50_ms", "P50"), ("p95_ms", "P95"), ("p99_ms", "P99")]
    width = 0.8 / len(stats)
    shades = [0.35, 0.55, 0.75, 1.0]
    x = np.arange(len(chosen))
    for i, (key, label) in enumerate(stats):
        values = [row[key] if row[key] is not None else 0.0 for _, row, _ in chosen]
        bars = axes.bar(
            x + (i - (len(stats) - 1) / 2) * width,
            values,
            width,
            color=[colors[db] for db, _, _ in chosen],
            alpha=shades[i],
            edgecolor="black",
            lw=0.5,
            label=label,
        )
        if not many or key == "p99_ms":  # many groups: only P99 is labelled, the rest would overlap
            axes.bar_label(bars, fmt="%.1f", fontsize=6, padding=1)
    if many:  # one line per group, slanted: the setting's ef (or the recall miss) under the label
        shown = _varying([row["setting"] or "" for _, row, _ in chosen])
        names = [
            f"{db} {shown(row['setting'] or '') if best else f'(recall < {MIN_RECALL})'}"
            for db, row, best in chosen
        ]
        axes.set_xticks(x, names, fontsize=7, rotation=35, ha="right", rotation_mode="anchor")
    else:
        axes.set_xticks(
            x,
            [
                f"{db}\n{row['setting']}{'' if best else f' (recall < {MIN_RECALL})'}"
                for db, row, best in chosen
            ],
            fontsize=7,
        )
    axes.set_ylabel("request latency (ms)")
    axes.set_title("Latency per request at each database's operating point")
    axes.grid(alpha=0.3, axis="y")
    from matplotlib.patches import Patch

    handles = [Patch(facecolor="grey", alpha=a, edgecolor="black", lw=0.5) for a in shades]
    axes.legend(handles, [s[1] for s in stats], fontsize=7, title="bar shade", title_fontsize=7)
    return save_figure(figure, path)


def draw_figures(run: ResultRows, out: Path) -> dict[str, Path]:
    """Every figure that has data, by name, as PNG files in ``out``."""
    colors = colors_for(run.databases)
    drawn = {
        "recall_qps": _plot_recall_qps(run, colors, out / "recall_qps.png"),
        "insert_throughput": _plot_insert(run, colors, out / "insert_throughput.png"),
        "latency": _plot_latency(run, colors, out / "latency.png"),
    }
    return {name: path for name, path in drawn.items() if path is not None}
