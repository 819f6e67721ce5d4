"""A measurement over repeats in the report: ``median (min–max)``; the figures themselves are
:mod:`core.format`'s."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from apps.evaluate.rules import Spread
from core.format import NONE, auto


def median_range(values: Spread | None, fmt: Callable[[float], str] = auto) -> str:
    """``median (min–max)`` of a measurement over its repeats; the figure alone where they all read the
    same (one repeat); ``—`` without one."""
    if values is None:
        return NONE
    low, high = fmt(values.low), fmt(values.high)
    return fmt(values.median) if low == high else f"{fmt(values.median)} ({low}–{high})"


def span(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    """``low–high`` of ``values`` as ``fmt`` writes them; one figure when both read the same (not
    ``3.0–3.0``)."""
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return low if low == high else f"{low}–{high}"
