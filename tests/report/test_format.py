"""The report's one set of formatters and its one Markdown table writer."""

from __future__ import annotations

import math
import re

from apps.evaluate.rules import Spread
from apps.report.format import median_range, span
from apps.report.mixed import mixed_table
from core.format import auto, cell, num, size, table


def test_numbers_read_a_dash_when_absent_or_not_finite() -> None:
    assert num(None) == num(math.nan) == num(math.inf) == "—"
    assert num(1234567) == "1,234,567"
    assert num(1234.5678) == "1,234.57"
    assert num(0.98765, 3) == "0.988"


def test_sizes_use_binary_units_up_to_tib() -> None:
    assert size(None) == "—"
    assert size(512) == "512 B"
    assert size(1536) == "1.5 KiB"
    assert size(3 * 1024**4) == "3.0 TiB"
    assert size(-2048) == "-2.0 KiB"


def test_spreads_and_auto_digits() -> None:
    assert auto(1234.4) == "1,234"
    assert auto(12.345) == "12.35"
    assert auto(0.98765) == "0.988"
    assert median_range(Spread(2.0, 1.0, 3.0)) == "2.00 (1.00–3.00)"
    assert median_range(Spread(2.0, 1.999, 2.001)) == "2.00"  # equal as shown: no "2.00 (2.00–2.00)"
    assert median_range(None) == "—"
    assert span([402, 400]) == "400–402" and span([3.01, 3.04], "{:.1f}") == "3.0"  # not "3.0–3.0"


def test_mixed_figures_are_written_out_not_in_exponent_form() -> None:
    rows = [
        {"stage": stage, "status": "ok", "label": "p", "database": "qdrant", "setting": "s", "repeat": 0}
        | {"qps": 12_345.0, "latency_mean_ms": 1.5, "latency_p99_ms": 2.0, "recall": 0.9}
        for stage in ("mixed", "mixed_baseline")
    ]
    text = "\n".join(mixed_table(rows))
    assert "| 12,345 |" in text and "e+0" not in text  # one repeat: the figure alone


def test_the_table_writer_keeps_every_cell_in_its_column() -> None:
    lines = table(["a", "b"], [["x|y", "two\nlines"], [3, "z" * 300]])
    assert lines[:2] == ["| a | b |", "|---|---|"]
    assert lines[2] == "| x\\|y | two lines |"
    assert lines[3].startswith("| 3 | ") and lines[3].endswith("... |") and len(lines[3]) < 260
    assert cell("a  b") == "a b"


def test_the_mixed_ratio_row_escapes_its_point_name_too() -> None:
    """The ratio row used to be written without escaping: a pipe in a label split it."""
    rows = [
        {"stage": stage, "status": "ok", "label": "p|q", "database": "qdrant", "setting": "s", "repeat": 0}
        | {"qps": qps, "latency_mean_ms": 1.0, "latency_p99_ms": 2.0, "recall": 0.9}
        for stage, qps in (("mixed", 50.0), ("mixed_baseline", 100.0))
    ]
    lines = mixed_table(rows)
    ratio = next(line for line in lines if "mixed ÷ baseline" in line)
    assert ratio.startswith("| p\\|q | mixed ÷ baseline |") and "0.50×" in ratio
    columns = {len(re.findall(r"(?<!\\)\|", line)) for line in lines}
    assert columns == {len(re.findall(r"\|", lines[0]))}
