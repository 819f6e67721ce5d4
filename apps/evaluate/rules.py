"""The studies' rules, each in one place: the operating point, the order of settings, repeat statistics.

* :func:`choose_operating_point`: the rule itself, over any candidates: the highest QPS among those with
  recall ≥ :data:`MIN_RECALL`, else the highest recall. :func:`best_operating_point` and
  :func:`operating_point` apply it to result rows; the study figures (:mod:`apps.report.study`) apply it to
  a line's settings.
* :func:`setting_order`: the order of a database's settings (k, batch size, clients, ef, setting).
* :func:`spread`: ``(median, min, max)`` of a measurement over its repeats.
* :func:`knee`: the highest offered rate an open-loop sweep serves within its P99 bound.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, TypeVar

from apps.vdb.stages.open_loop import keeps_up

MIN_RECALL = 0.95  # the studies' recall target

T = TypeVar("T")


def choose_operating_point(
    candidates: Iterable[T],
    recall: Callable[[T], float],
    qps: Callable[[T], float],
    min_recall: float = MIN_RECALL,
    tiebreak: Callable[[T], Any] = lambda _: 0,
) -> tuple[T | None, bool]:
    """``(candidate, reached)``: the highest QPS among those with recall ≥ ``min_recall`` (reached True),
    else the highest recall (reached False); ``(None, False)`` without candidates.

    Equal QPS prefers the higher recall and equal recall the higher QPS; then ``tiebreak``'s higher value,
    then the first candidate.
    """
    items = list(candidates)
    good = [c for c in items if recall(c) >= min_recall]
    if good:
        return max(good, key=lambda c: (qps(c), recall(c), tiebreak(c))), True
    if not items:
        return None, False
    return max(items, key=lambda c: (recall(c), qps(c), tiebreak(c))), False


def _measured(row: dict[str, Any]) -> bool:
    """A query row that counts: ok (or no status), not stalled, finite QPS and recall."""
    if row.get("stage", "query") != "query" or row.get("status", "ok") not in (None, "ok"):
        return False
    if row.get("stalled"):  # a setting that stalled twice is not a normal measurement
        return False
    q, r = row.get("qps"), row.get("recall")
    return q is not None and r is not None and math.isfinite(q) and math.isfinite(r)


def operating_point(
    rows: Iterable[dict[str, Any]], min_recall: float = MIN_RECALL
) -> tuple[dict[str, Any] | None, bool]:
    """(row, is_best): the best QPS at recall ≥ ``min_recall``, else the highest-recall setting (is_best
    False). Rows of other stages, failed or stalled rows and rows without a finite QPS or recall are ignored.
    """
    return choose_operating_point(
        (r for r in rows if _measured(r)), lambda r: r["recall"], lambda r: r["qps"], min_recall
    )


def best_operating_point(
    rows: Iterable[dict[str, Any]], min_recall: float = MIN_RECALL
) -> dict[str, Any] | None:
    """The row with the highest QPS among those with recall ≥ ``min_recall`` (None when none qualifies).

    Rows of other stages, failed or stalled rows and rows without a finite QPS or recall are ignored;
    equal QPS prefers the higher recall. Pass the rows of one database to get its operating point.
    """
    row, reached = operating_point(rows, min_recall)
    return row if reached else None


def setting_order(row: dict[str, Any]) -> tuple:
    """Sort key of a setting's row: k, batch size, clients, ef (absent: first), then its label."""

    def key(value: Any) -> float:
        return -1 if value is None else value

    return (key(row["k"]), key(row["batch_size"]), key(row["clients"]), key(row["ef"]), row["setting"] or "")


class Spread(NamedTuple):
    """A measurement over its repeats: the median and the range."""

    median: float
    low: float
    high: float


def spread(values: Sequence[float]) -> Spread | None:
    """The median, min and max of ``values`` (None when empty)."""
    if not values:
        return None
    return Spread(statistics.median(values), min(values), max(values))


def closed_setting(label: str) -> str:
    """The closed-loop setting an open-loop label extends (``...,k=10,rate=500`` -> ``...,k=10``)."""
    return label.split(",rate=", 1)[0]


def knee(rows: Iterable[dict[str, Any]], bound_ms: float | None) -> dict[str, Any] | None:
    """The open-loop row of the highest offered rate that is served: the generator kept its pace, nothing
    was left unsent, achieved ≥ 0.98 × offered and (with ``bound_ms``) the intended-time P99 within the
    bound (:func:`apps.vdb.stages.open_loop.keeps_up`). None when no rate is served. Pass the rows of one
    point and one closed-loop setting."""
    served = [
        r
        for r in rows
        if r.get("stage") == "open_loop"
        and r.get("status") == "ok"
        and r.get("rate")
        and keeps_up(r, bound_ms)
    ]
    return max(served, key=lambda r: r["rate"], default=None)
