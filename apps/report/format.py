"""A measurement over repeats in the report: ``median (min–max)``; the figures themselves are
:mod:`core.format`'s."""

from __future__ import annotations

from collections.abc import Callable

from apps.evaluate.rules import Spread
from core.format import NONE, auto


def median_range(values: Spread | None, fmt: Callable[[float], str] = auto) -> str:
    """``median (min–max)`` of a measurement over its repeats; ``—`` without one."""
    if values is None:
        return NONE
    return f"{fmt(values.median)} ({fmt(values.low)}–{fmt(values.high)})"
