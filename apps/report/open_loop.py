"""The report's "Latency under offered load" section: open-loop settings, their knee, the closed loop beside.

Per point and closed-loop setting: every offered rate with its achieved rate, the latency percentiles from
the intended send time and from the actual send (service time), and the generator's lag; a rate whose
generator lagged is marked invalid instead of showing its figures. The knee is the highest offered rate
served within the P99 bound (:func:`apps.evaluate.rules.knee`), beside the closed loop's QPS of the same
setting. One figure: intended-time and service-time P99 against offered rate, and achieved against offered.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from apps.evaluate.results import ResultRows, is_ok, point_name
from apps.evaluate.rules import closed_setting, knee
from apps.report.figures import colors_for, finish_axes, new_figure, save_figure
from apps.vdb.stages.open_loop import invalid
from core.format import num, table

CAPTION = "Open loop: P99 latency and achieved throughput against offered rate"


def _groups(run: ResultRows) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(point, closed-loop setting, its open-loop rows by rate) for every open-loop sweep of the run."""
    rows = [r for db in run.databases for r in run.of(db, "open_loop")]
    key = lambda r: (point_name(r), closed_setting(r["setting"] or ""))  # noqa: E731
    return [
        (point, setting, sorted(group, key=lambda r: r["rate"] or 0.0))
        for (point, setting), group in itertools.groupby(sorted(rows, key=key), key=key)
    ]


def _shown(row: dict[str, Any]) -> bool:
    """A row whose figures are the server's: run, and neither the generator nor its clients set the pace."""
    return is_ok(row) and invalid(row) is None


def _status(row: dict[str, Any]) -> str:
    if not is_ok(row):
        return f"not run: {row.get('error') or 'no reason recorded'}"
    why = invalid(row)
    if why:
        return f"**invalid**: {why}"
    if row.get("unsent"):
        return f"{num(row['unsent'])} requests unsent at the window's end"
    return ""


def open_loop_section(run: ResultRows, out: Path) -> tuple[list[str], dict[str, Path]]:
    """The section's Markdown lines and its figure (``{}`` and no lines without open-loop rows)."""
    groups = _groups(run)
    if not groups:
        return [], {}
    lines = [
        "## Latency under offered load (open loop)",
        "",
        "Requests arrive at the offered rate whether or not earlier ones were answered; latency counts from "
        "each request's *intended* send time, so queueing behind a slow or stalled server is included "
        "(a closed loop, the query sweep above, stops sending while it waits and hides it). Service time "
        "counts from the actual send. A rate at which the generator fell behind its schedule, or a client "
        "was busy more than 70% of the window, is invalid: it measured the load generator, not the server "
        "(docs/open-loop.md). Scheduled: the arrivals the window held ÷ its seconds (a Poisson window "
        "holds a few percent more or fewer than the rate); achieved is compared with it.",
        "",
    ]
    knees = []
    for point, setting, rows in groups:
        bound = next((r["p99_bound_ms"] for r in rows if r.get("p99_bound_ms")), None)
        best = knee(rows, bound)
        closed = next((r for r in run.queries(point) if r["setting"] == setting), None)
        knees.append(
            [
                point,
                setting,
                num(best and best["rate"], 0) if best else "none served",
                num(bound) if bound else "— (achieved ≥ 0.98 × offered only)",
                num(best and best["intended_p99_ms"]),
                num(closed and closed["qps"] / (closed["batch_size"] or 1), 0),
            ]
        )
    header = [
        "point",
        "setting",
        "knee (requests/s)",
        "P99 bound (ms)",
        "P99 at knee (ms)",
        "closed loop (requests/s)",
    ]
    lines += [
        "The knee: the highest offered rate served with P99 under the bound and achieved ≥ 0.98 × offered.",
        "",
    ]
    lines += [*table(header, knees), ""]
    header = [
        "point",
        "setting",
        "offered/s",
        "scheduled/s",
        "achieved/s",
        "P50 (ms)",
        "P99 (ms)",
        "P99.9 (ms)",
        "service P50 (ms)",
        "service P99 (ms)",
        "service P99.9 (ms)",
        "lag P99 (ms)",
        "note",
    ]
    body = []
    for point, setting, rows in groups:
        for row in rows:
            shown = _shown(row)
            figures = [
                row.get(k)
                for k in (
                    "achieved_rate",
                    "intended_p50_ms",
                    "intended_p99_ms",
                    "intended_p999_ms",
                    "p50_ms",
                    "p99_ms",
                    "p999_ms",
                )
            ]
            cells = [num(v, 0 if i == 0 else 2) for i, v in enumerate(figures)] if shown else ["—"] * 7
            rates = [num(row["rate"], 0), num(row.get("offered_rate"), 0)]
            body.append([point, setting, *rates, *cells, num(row.get("lag_p99_ms")), _status(row)])
    lines += [*table(header, body), ""]
    figure = _plot(groups, out / "open_loop.png")
    lines += [f"![{CAPTION}]({figure.name})", ""]
    return lines, {"open_loop": figure}


def _plot(groups: list[tuple[str, str, list[dict[str, Any]]]], path: Path) -> Path:
    """Left: P99 from intended time (solid) and service P99 (dashed) against offered rate; right: achieved
    against offered (the diagonal: every request served). Invalid and unrun rates are left out."""
    figure = new_figure(width=11.0, height=4.6)
    latency, throughput = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    names = [f"{point} {setting}" if len(groups) > 1 else point for point, setting, _ in groups]
    colors = colors_for(names)
    highest = 0.0
    for name, (_, _, rows) in zip(names, groups, strict=True):
        shown = [r for r in rows if _shown(r) and r.get("rate")]
        if not shown:
            continue
        rates = [r["rate"] for r in shown]
        highest = max(highest, *rates)
        latency.plot(
            rates, [r["intended_p99_ms"] for r in shown], "o-", color=colors[name], label=f"{name} P99"
        )
        latency.plot(
            rates, [r["p99_ms"] for r in shown], "x--", color=colors[name], label=f"{name} service P99"
        )
        # against the schedule's own rate (a Poisson window holds a few percent more or fewer arrivals)
        scheduled = [r.get("offered_rate") or r["rate"] for r in shown]
        highest = max(highest, *scheduled)
        throughput.plot(scheduled, [r["achieved_rate"] for r in shown], "o-", color=colors[name], label=name)
        bound = next((r["p99_bound_ms"] for r in rows if r.get("p99_bound_ms")), None)
        if bound:
            latency.axhline(bound, color=colors[name], lw=0.8, alpha=0.5)
    from matplotlib.ticker import ScalarFormatter

    latency.set_yscale("log")
    latency.yaxis.set_major_formatter(ScalarFormatter())  # 20, 50, not 2 x 10^1
    latency.yaxis.set_minor_formatter(ScalarFormatter())
    throughput.plot([0, highest], [0, highest], color="grey", lw=0.8, label="achieved = offered")
    finish_axes(latency, "offered rate (requests/s)", "latency (ms)", "P99 from intended send vs service P99")
    finish_axes(
        throughput, "offered (scheduled) rate (requests/s)", "achieved (requests/s)", "Achieved vs offered"
    )
    return save_figure(figure, path)
