"""How figures and tables are written, in one place: numbers, sizes and Markdown tables (the report, the
dataset card, the console).

A figure that is absent (None) or not finite reads ``—`` everywhere. :func:`table` is the one Markdown
table writer: every body cell goes through :func:`cell`, so a pipe in a name or an error cannot split a row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

NONE = "—"  # an absent or non-finite figure


def num(value: Any, digits: int = 2) -> str:
    """An integer with thousands separators, a float with ``digits`` decimals, ``—`` when absent or not
    finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return NONE
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def size(value: float | None) -> str:
    """Bytes in binary units: ``512 B``, ``1.5 KiB`` .. ``2.0 TiB``; ``—`` when absent or not finite."""
    if value is None or not math.isfinite(value):
        return NONE
    scaled = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(scaled) < 1024 or unit == "TiB":
            return f"{scaled:.0f} {unit}" if unit == "B" else f"{scaled:.1f} {unit}"
        scaled /= 1024
    return str(value)  # not reached: TiB ends the loop


def duration(seconds: float) -> str:
    """``45 s``, ``12 min`` or ``3.4 h``."""
    if seconds < 120:
        return f"{seconds:,.0f} s"
    return f"{seconds / 60:,.0f} min" if seconds < 7200 else f"{seconds / 3600:,.1f} h"


def auto(value: float) -> str:
    """A figure with the decimals its size needs: none from 100, two from 1, three below 1."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.3f}" if abs(value) < 1 else f"{value:,.2f}"


def cell(text: Any, limit: int | None = 240) -> str:
    """Safe inside a Markdown table cell: one line, no pipes, at most ``limit`` characters (None: any)."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def table(header: Sequence[str], body: Sequence[Sequence[Any]], limit: int | None = 240) -> list[str]:
    """The lines of a Markdown table: the header, its rule, one line per body row (cells made safe, each at
    most ``limit`` characters; None: reference text that must stay whole)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c, limit) for c in row) + " |" for row in body]
    return lines
