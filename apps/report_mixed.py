"""The mixed insert + query workload's degradation table (000 Table VII) for the report.

Rows with ``stage`` ``mixed`` (queries measured while inserting) and ``mixed_baseline`` (the same queries
on the preloaded collection alone) -> per point and pattern the median (min–max) over repeats of QPS, mean
and P99 latency and recall, and a ratio row: mixed ÷ baseline of the medians.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from apps.results import point_name

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

    def median(members: list[Row], key: str) -> tuple[float, float, float] | None:
        values = [v for v in (_p99(m) if key == "p99" else m.get(key) for m in members) if v is not None]
        return (statistics.median(values), min(values), max(values)) if values else None

    head = ["point", "pattern", "setting", "repeats", *[c for _, c in MIXED_COLUMNS]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (name, pattern, setting), members in sorted(groups.items()):
        cells = [name, pattern, setting or "—", str(len(members))]
        for key, _ in MIXED_COLUMNS:
            m = median(members, key)
            cells.append("—" if m is None else f"{m[0]:,.3g} ({m[1]:,.3g}–{m[2]:,.3g})")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        if pattern != "mixed":
            continue
        base = groups.get((name, "baseline", setting)) or next(
            (v for k, v in groups.items() if k[:2] == (name, "baseline")), None
        )
        if base:
            ratios = []
            for key, _ in MIXED_COLUMNS:
                mixed, alone = median(members, key), median(base, key)
                ratios.append(
                    "—" if not mixed or not alone or not alone[0] else f"{mixed[0] / alone[0]:.2f}×"
                )
            lines.append("| " + " | ".join([name, "mixed ÷ baseline", setting or "—", "", *ratios]) + " |")
    return lines
