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
from apps.evaluate.rules import closed_setting, knee, spread
from apps.report.figures import colors_for, finish_axes, new_figure, save_figure
from apps.report.format import median_range
from apps.vdb.stages.open_loop import KEPT_UP, invalid
from core.format import num, table

CAPTION = "Open loop: P99 latency and achieved throughput against offered rate"


Group = tuple[str, str, int, list[dict[str, Any]]]


def _groups(run: ResultRows) -> list[Group]:
    """(point, closed-loop setting, repeat, its open-loop rows by rate) for every open-loop sweep."""
    rows = [r for db in run.databases for r in run.of(db, "open_loop")]
    key = lambda r: (point_name(r), closed_setting(r["setting"] or ""), r.get("repeat") or 0)  # noqa: E731
    return [
        (point, setting, repeat, sorted(group, key=lambda r: r["rate"] or 0.0))
        for (point, setting, repeat), group in itertools.groupby(sorted(rows, key=key), key=key)
    ]


def _shown(row: dict[str, Any]) -> bool:
    """A row whose figures are the server's: run, not stalled, and neither the generator nor its clients
    set the pace."""
    return is_ok(row) and not row.get("stalled") and invalid(row) is None


def _status(row: dict[str, Any]) -> str:
    if not is_ok(row):
        return row.get("error") or f"{row['status']}: no reason recorded"
    if row.get("stalled"):
        return f"**stalled**: {row.get('error') or 'a request timed out'}"
    why = invalid(row)
    if why:
        return f"**invalid**: {why}"
    if row.get("unsent"):
        return f"{num(row['unsent'])} requests unsent at the window's end"
    return ""


def _knee_of(rows: list[dict[str, Any]], bound: float | None) -> tuple[float | None, str]:
    """(the knee's rate, why the search found no higher one) of one repeat's rates."""
    best = knee(rows, bound)
    above = [r for r in rows if r.get("rate") and (best is None or r["rate"] > best["rate"])]
    first = min(above, key=lambda r: r["rate"], default=None)
    if first is None:
        return (best and best["rate"]), "every rate served"
    if not is_ok(first) or first.get("stalled") or invalid(first):
        reason = _status(first).replace("**", "")
    elif first.get("unsent") or not first["achieved_rate"] >= KEPT_UP * first["offered_rate"]:
        reason = "achieved < 0.98 × offered"
    else:
        reason = f"P99 {num(first['intended_p99_ms'])} ms"
    return (best and best["rate"]), f"{num(first['rate'], 0)}/s: {reason}"


def open_loop_section(rows: list[dict[str, Any]], out: Path) -> tuple[list[str], dict[str, Path]]:
    """The section's Markdown lines and its figure from the result rows of every repeat (``{}`` and no
    lines without open-loop rows): the knee per repeat, its median (min–max) over repeats."""
    run = ResultRows(rows)
    groups = _groups(run)
    if not groups:
        return [], {}
    lines = [
        "## Latency under offered load (open loop)",
        "",
        "Requests arrive at the offered rate whether or not earlier ones were answered; latency counts from "
        "each request's *intended* send time, so queueing behind a slow or stalled server is included "
        "(a closed loop, the query sweep above, stops sending while it waits and hides it). Service time "
        "counts from the actual send. A rate at which the generator fell behind its schedule, or more than "
        "1% of requests waited for a free sender of their client, is invalid: it measured the load "
        "generator, not the server (docs/open-loop.md). Scheduled: the arrivals the window held per second "
        "(a Poisson window holds a few percent more or fewer than the rate); achieved is compared with it.",
        "",
        "The knee: the highest offered rate served with P99 under the bound and achieved ≥ 0.98 × offered; "
        "'first not served' says why the search found no higher one.",
        "",
    ]
    knees: dict[tuple[str, str], list[tuple[float | None, str]]] = {}
    bounds: dict[tuple[str, str], float | None] = {}
    for point, setting, _, members in groups:
        bound = next((r["p99_bound_ms"] for r in members if r.get("p99_bound_ms")), None)
        bounds[point, setting] = bound
        knees.setdefault((point, setting), []).append(_knee_of(members, bound))
    body = []
    for (point, setting), found in knees.items():
        closed = [r["qps"] / (r["batch_size"] or 1) for r in run.queries(point) if r["setting"] == setting]
        values = [rate for rate, _ in found if rate is not None]
        median = spread(values)
        shown = (
            median_range(median, "{:,.0f}".format)
            if len(found) > 1
            else num(values[0] if values else None, 0)
        )
        bound = bounds[point, setting]
        body.append(
            [
                point,
                setting,
                str(len(found)),
                shown if values else "none served",
                "; ".join(why for _, why in found),
                num(bound) if bound else "— (achieved only)",
                median_range(spread(closed), "{:,.0f}".format)
                if len(closed) > 1
                else num(next(iter(closed), None), 0),
            ]
        )
    header = ["point", "setting", "repeats", "knee (requests/s)", "first not served", "P99 bound (ms)"]
    lines += [*table([*header, "closed loop (requests/s)"], body), ""]
    header = [
        "point",
        "setting",
        "repeat",
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
    figures = ("achieved_rate", "intended_p50_ms", "intended_p99_ms", "intended_p999_ms", "p50_ms", "p99_ms")
    for point, setting, repeat, members in groups:
        for row in members:
            values = [row.get(k) for k in (*figures, "p999_ms")]
            cells = [num(v, 0 if i == 0 else 2) for i, v in enumerate(values)] if _shown(row) else ["—"] * 7
            rates = [num(row["rate"], 0), num(row.get("offered_rate"), 0)]
            lag = num(row.get("lag_p99_ms"))
            body.append([point, setting, str(repeat), *rates, *cells, lag, _status(row)])
    lines += [*table(header, body), ""]
    figure = _plot(groups, out / "open_loop.png")
    lines += [f"![{CAPTION}]({figure.name})", ""]
    return lines, {"open_loop": figure}


def _plot(groups: list[Group], path: Path) -> Path:
    """Left: P99 from intended time (solid) and service P99 (dashed) against offered rate; right: achieved
    against scheduled (the diagonal: every request served). One colour per point and setting, one line per
    repeat; invalid, stalled and unrun rates are left out."""
    from matplotlib.ticker import ScalarFormatter

    figure = new_figure(width=11.0, height=4.6)
    latency, throughput = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    series = list(dict.fromkeys((point, setting) for point, setting, _, _ in groups))
    names = {key: f"{key[0]} {key[1]}" if len(series) > 1 else key[0] for key in series}
    colors = colors_for(list(names.values()))
    highest, labelled = 0.0, set()
    for point, setting, _, rows in groups:
        shown = [r for r in rows if _shown(r) and r.get("rate")]
        name = names[point, setting]
        if not shown:
            continue
        first = name not in labelled  # repeats share their colour and one legend entry
        labelled.add(name)
        rates = [r["rate"] for r in shown]
        p99 = [r["intended_p99_ms"] for r in shown]
        latency.plot(rates, p99, "o-", color=colors[name], label=f"{name} P99" if first else None)
        service = [r["p99_ms"] for r in shown]
        latency.plot(
            rates, service, "x--", color=colors[name], label=f"{name} service P99" if first else None
        )
        # against the schedule's own rate (a Poisson window holds a few percent more or fewer arrivals)
        scheduled = [r.get("offered_rate") or r["rate"] for r in shown]
        highest = max(highest, *rates, *scheduled)
        achieved = [r["achieved_rate"] for r in shown]
        throughput.plot(scheduled, achieved, "o-", color=colors[name], label=name if first else None)
        bound = next((r["p99_bound_ms"] for r in rows if r.get("p99_bound_ms")), None)
        if bound and first:
            latency.axhline(bound, color=colors[name], lw=0.8, alpha=0.5)
    if labelled:
        latency.set_yscale("log")
        latency.yaxis.set_major_formatter(ScalarFormatter())  # 20, 50, not 2 x 10^1
        latency.yaxis.set_minor_formatter(ScalarFormatter())
        throughput.plot([0, highest], [0, highest], color="grey", lw=0.8, label="achieved = offered")
    finish_axes(latency, "offered rate (requests/s)", "latency (ms)", "P99 from intended send vs service P99")
    finish_axes(
        throughput, "offered (scheduled) rate (requests/s)", "achieved (requests/s)", "Achieved vs offered"
    )
    return save_figure(figure, path)
