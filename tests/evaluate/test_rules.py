"""The studies' rules in their one home: the operating point, the setting order, repeat statistics."""

from __future__ import annotations

import math

from apps.evaluate.rules import (
    MIN_RECALL,
    Spread,
    choose_operating_point,
    operating_point,
    setting_order,
    spread,
)


def _row(setting: str, qps: float, recall: float, **extra: object) -> dict:
    return {"stage": "query", "status": "ok", "setting": setting, "qps": qps, "recall": recall, **extra}


def test_operating_point_prefers_the_fastest_setting_at_the_target() -> None:
    rows = [_row("slow", 10.0, 0.99), _row("fast", 50.0, 0.96), _row("fastest", 90.0, 0.5)]
    assert operating_point(rows) == (rows[1], True)


def test_the_fallback_ignores_stalled_and_non_finite_rows() -> None:
    """Below the target the highest recall wins, but only among rows the best point would consider."""
    rows = [
        _row("ok", 100.0, 0.80),
        _row("stalled", 5.0, 0.90, stalled=True),
        _row("nan", 7.0, math.nan),
        _row("failed", 9.0, 0.85, status="failed"),
    ]
    best, reached = operating_point(rows)
    assert not reached and best is not None and best["setting"] == "ok"
    assert operating_point([rows[1], rows[2]]) == (None, False)


def test_ties_prefer_the_other_figure_then_the_tiebreak() -> None:
    items = {"a": (10.0, 0.96), "b": (10.0, 0.97), "c": (1.0, 0.5), "d": (1.0, 0.5)}
    pick, reached = choose_operating_point(items, lambda s: items[s][1], lambda s: items[s][0])
    assert (pick, reached) == ("b", True)
    low = {k: items[k] for k in ("c", "d")}
    pick, reached = choose_operating_point(
        low, lambda s: low[s][1], lambda s: low[s][0], tiebreak=lambda s: s
    )
    assert (pick, reached) == ("d", False)
    assert MIN_RECALL == 0.95


def test_setting_order_puts_absent_values_first() -> None:
    rows = [
        {"k": 10, "batch_size": 1, "clients": 1, "ef": 64, "setting": "b"},
        {"k": 10, "batch_size": 1, "clients": 1, "ef": None, "setting": None},
        {"k": None, "batch_size": None, "clients": 2, "ef": 8, "setting": "a"},
    ]
    assert [r["setting"] for r in sorted(rows, key=setting_order)] == ["a", None, "b"]


def test_spread_is_the_median_and_range() -> None:
    assert spread([3.0, 1.0, 2.0, 10.0]) == Spread(2.5, 1.0, 10.0)
    assert spread([]) is None
