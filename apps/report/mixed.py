"""The mixed insert + query workload in the report: its degradation table (000 Table VII) and its figure.

:func:`mixed_figure`: each mixed-phase request's latency over time, rows acknowledged on a second axis.

Rows with ``stage`` ``mixed`` (queries measured while inserting) and ``mixed_baseline`` (the same queries
on the preloaded collection alone) -> per point and pattern the median (min–max) over repeats of QPS, mean
and P99 latency and recall, and a ratio row: mixed ÷ baseline of the medians.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from apps.evaluate.metrics import window_stats
from apps.evaluate.results import point_name
from apps.evaluate.rules import Spread, spread
from apps.report.figures import new_figure, save_figure
from apps.report.format import median_range
from apps.vdb.stages.mixed_config import MixedRecord
from apps.vdb.stages.open_loop import invalid
from apps.vdb.stages.query_raw import read_raw, read_requests, requests_from_raw
from core.format import NONE, table

Row = dict[str, Any]


def _p99(row: Row) -> float | None:
    value = row.get("latency_p99_ms")
    return value if value is not None else row.get("p99_ms")


MIXED_COLUMNS = (("qps", "QPS"), ("latency_mean_ms", "mean (ms)"), ("p99", "P99 (ms)"), ("recall", "recall"))


def mixed_table(rows: Iterable[Row]) -> list[str]:
    """Markdown lines of the degradation table ([] without mixed rows).

    Expects rows with ``stage`` ``mixed`` (measured while inserting) or ``mixed_baseline`` (any stage
    starting with ``mixed`` and containing ``baseline``: the same queries on the preloaded collection alone),
    ``status`` ok, ``label``/``database``, ``setting``, ``repeat`` and the columns ``qps``,
    ``latency_mean_ms``, ``latency_p99_ms`` (or ``p99_ms``) and ``recall``. Shows per point and pattern the
    median (min–max) over repeats, and mixed ÷ baseline of the medians.
    """
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        stage = str(r.get("stage") or "")
        if stage.startswith("mixed") and r.get("status", "ok") == "ok":
            pattern = "baseline" if "baseline" in stage else "mixed"
            groups.setdefault((point_name(r), pattern, r.get("setting") or ""), []).append(r)
    if not any(k[1] == "mixed" for k in groups):
        return []

    def spread_of(members: list[Row], key: str) -> Spread | None:
        return spread(
            [v for v in (_p99(m) if key == "p99" else m.get(key) for m in members) if v is not None]
        )

    body: list[list[str]] = []
    for (name, pattern, setting), members in sorted(groups.items()):
        # an open-loop phase whose generator or clients set the pace is marked, not passed off as normal
        why = next((w for w in map(invalid, members) if w), None)
        shown = pattern if why is None else f"{pattern} (**invalid**: {why})"
        cells = [name, shown, setting or NONE, str(len(members))]
        for key, _ in MIXED_COLUMNS:
            cells.append(median_range(spread_of(members, key)))  # auto: 12,345 not 1.23e+04
        body.append(cells)
        if pattern != "mixed":
            continue
        base = groups.get((name, "baseline", setting)) or next(
            (v for k, v in groups.items() if k[:2] == (name, "baseline")), None
        )
        if base:
            ratios = []
            for key, _ in MIXED_COLUMNS:
                mixed, alone = spread_of(members, key), spread_of(base, key)
                ratios.append(
                    NONE
                    if not mixed or not alone or not alone.median
                    else f"{mixed.median / alone.median:.2f}×"
                )
            body.append([name, "mixed ÷ baseline", setting or "—", "", *ratios])
    return table(["point", "pattern", "setting", "repeats", *[c for _, c in MIXED_COLUMNS]], body)


def mixed_figure(record: MixedRecord, title: str, path: str | Path) -> Path | None:
    """Latency of each mixed-phase request over time, rows acknowledged on a second axis; None: no data."""
    raw = read_raw(record.queries_file)
    if raw.num_rows == 0:
        return None
    requests = requests_from_raw(raw)
    inserts = pq.read_table(record.inserts_file).sort_by("t_ack")
    start = float(pc.min(requests.column("t_start")).as_py())
    sent = requests.column("t_start").to_numpy() - start
    latency = (requests.column("t_end").to_numpy() - requests.column("t_start").to_numpy()) * 1000.0
    figure = new_figure()
    axes = figure.add_subplot(1, 1, 1)
    axes.scatter(sent, latency, s=4, alpha=0.5, color="tab:blue", label="query request latency")
    baseline = window_stats(read_requests(record.baseline_file))
    axes.axhline(baseline["p99_ms"], color="tab:gray", ls="--", lw=1, label="baseline P99")
    axes.set_xlabel("seconds since the mixed phase started")
    axes.set_ylabel("latency per request (ms)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    acked = record.preload_rows + np.cumsum(
        inserts.column("row_stop").to_numpy() - inserts.column("row_start").to_numpy()
    )
    second = axes.twinx()
    second.step(
        np.concatenate([[0.0], inserts.column("t_ack").to_numpy() - start]),
        np.concatenate([[record.preload_rows], acked]),
        where="post",
        color="tab:orange",
        label="rows acknowledged",
    )
    second.set_ylabel("rows acknowledged")
    lines, labels = axes.get_legend_handles_labels()
    more, names = second.get_legend_handles_labels()
    axes.legend(lines + more, labels + names, fontsize=7, loc="upper left")
    return save_figure(figure, Path(path))
