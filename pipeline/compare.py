"""``python -m pipeline compare <run-a> <run-b>``: two runs' headline figures side by side.

For every database or sweep point (label) in either run: best QPS at recall ≥ 0.95, recall, upload and
index time of both, and the ratio b/a. Below the table, the configuration differences that change what
the figures mean: the dataset, model, queries and ground truth (their content keys), the query and
insert sweeps, and each label's parameters (collection, database settings, swept values).
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from apps.evaluate.results import name_order, point_name, read_results
from pipeline.headline import (
    figures,
    number,
    print_table,
    qps_cell,
    ratio,
    read_summary,
    seconds,
    setting_cells,
)
from pipeline.runs import RunRecord

MAX_NOTES = 40


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> ``{"a.b": leaf}`` (lists stay leaves)."""
    if not isinstance(value, dict):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, item in value.items():
        flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """``name: a -> b`` for every key whose value differs (absent or null on one side: ``—``)."""
    fa, fb = ({k: v for k, v in _flatten(side).items() if v is not None} for side in (a, b))
    return [
        f"{key}: {fa.get(key, '—')} -> {fb.get(key, '—')}"
        for key in sorted(set(fa) | set(fb))
        if fa.get(key, "—") != fb.get(key, "—")
    ]


def _label_params(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each label's parameters: the collection and settings it ran with (its deploy row) and swept values."""
    params: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = params.setdefault(point_name(row), {"database": row["database"]})
        entry.update({f"swept.{k}": v for k, v in (row.get("sweep") or {}).items()})
        if row["stage"] == "deploy" and row.get("params"):
            try:
                entry.update(json.loads(row["params"]))
            except ValueError:
                entry["params"] = row["params"]
    return params


def _setting(best: dict[str, Any] | None) -> str:
    """``ef / batch / clients`` of a query row."""
    return "—" if best is None else " / ".join(setting_cells(best))


def compare_table(a: RunRecord, b: RunRecord) -> Table:
    """The side-by-side table: for each label present in either run, its headline figures in a and b."""
    left = {r["name"]: r for r in read_summary(a.report_dir / "results.parquet", a.run_id)}
    right = {r["name"]: r for r in read_summary(b.report_dir / "results.parquet", b.run_id)}
    labels = sorted(set(left) | set(right), key=name_order)
    table = Table(title=f"a = {a.run_id}\nb = {b.run_id}", title_justify="left")
    table.add_column("database", no_wrap=True, min_width=max((len(x) for x in labels), default=8))
    table.add_column("figure", no_wrap=True)
    table.add_column("a", justify="right")
    table.add_column("b", justify="right")
    table.add_column("b/a", justify="right", no_wrap=True)
    for label in labels:
        ra, rb = left.get(label), right.get(label)
        fa = figures(ra) if ra else {}
        fb = figures(rb) if rb else {}
        only = "" if ra and rb else f" (only in {'a' if ra else 'b'})"
        lines = [
            (
                "best QPS",
                qps_cell(ra) if ra else "—",
                qps_cell(rb) if rb else "—",
                ratio(fa.get("qps"), fb.get("qps")),
            ),
            ("recall", number(fa.get("recall"), 3), number(fb.get("recall"), 3), ""),
            ("ef / batch / clients", _setting(fa.get("setting")), _setting(fb.get("setting")), ""),
            (
                "upload (s)",
                seconds(fa.get("upload_s")),
                seconds(fb.get("upload_s")),
                ratio(fa.get("upload_s"), fb.get("upload_s")),
            ),
            (
                "index (s)",
                seconds(fa.get("index_s")),
                seconds(fb.get("index_s")),
                ratio(fa.get("index_s"), fb.get("index_s")),
            ),
        ]
        for number_, (figure, cell_a, cell_b, quotient) in enumerate(lines):
            name = Text(label + only) if number_ == 0 else Text("")  # Text: brackets are not markup
            table.add_row(name, figure, Text(cell_a), Text(cell_b), quotient)
        table.add_section()
    return table


def config_notes(a: RunRecord, b: RunRecord) -> list[str]:
    """The configuration differences that matter, one line each (empty when there are none)."""
    notes = []
    for stage, what in (("embed", "dataset"), ("queries", "queries"), ("groundtruth", "ground truth")):
        ka = a.stages[stage].key if stage in a.stages else None
        kb = b.stages[stage].key if stage in b.stages else None
        if ka != kb:
            notes.append(f"{what} key: {ka or '—'} -> {kb or '—'}")
    ca, cb = a.config_dict, b.config_dict
    # Which dataset (a stored name, an import's files, expected rows): a key alone does not say what changed.
    da, db = ({k: v for k, v in (c.get("dataset") or {}).items() if k != "dir"} for c in (ca, cb))
    notes += [f"dataset.{line}" for line in _differences(da, db)]  # not dir: where it is kept, not what
    for section in ("queries", "groundtruth"):  # what the keys above changed for (k, metric, count)
        notes += [f"{section}.{line}" for line in _differences(ca.get(section) or {}, cb.get(section) or {})]
    ea, eb = ca.get("embedding") or {}, cb.get("embedding") or {}
    model_a, model_b = ea.get("model_id") or ea.get("model"), eb.get("model_id") or eb.get("model")
    if model_a != model_b:
        notes.append(f"model: {model_a} -> {model_b}")
    skip = ("model", "export_dir")  # the model is above; where its export is cached does not matter
    notes += [f"embedding.{line}" for line in _differences(ea, eb) if not line.startswith(skip)]
    va, vb = ca.get("vdb") or {}, cb.get("vdb") or {}
    for part in ("query", "insert", "repeats", "cores_per_worker", "bind"):  # collection: per label below
        notes += [f"vdb.{line}" for line in _differences({part: va.get(part)}, {part: vb.get(part)})]
    pa_ = _label_params(read_results(a.report_dir / "results.parquet"))
    pb_ = _label_params(read_results(b.report_dir / "results.parquet"))
    for label in sorted(set(pa_) & set(pb_), key=name_order):
        notes += [f"{label}: {line}" for line in _differences(pa_[label], pb_[label])]
    # a database or point one of the runs did not measure
    for label in sorted(set(pa_) ^ set(pb_), key=name_order):
        notes.append(f"{label}: only in {a.run_id if label in pa_ else b.run_id}")
    return notes


def other_datasets(a: RunRecord, b: RunRecord) -> str | None:
    """A warning when the two runs measured different datasets (their embed stages' keys differ): their
    ratios then compare different work. None when the dataset is the same."""
    ka, kb = (run.stages["embed"].key if "embed" in run.stages else None for run in (a, b))
    if ka == kb:
        return None
    na, nb = ((run.config_dict.get("dataset") or {}).get("name") or key for run, key in ((a, ka), (b, kb)))
    return (
        f"warning: a and b measured different datasets ({na} -> {nb}): each ratio b/a compares "
        "different data, not a change of settings"
    )


def print_comparison(out: Console, a: RunRecord, b: RunRecord) -> None:
    """Print the side-by-side table and the configuration differences."""
    if (warning := other_datasets(a, b)) is not None:
        out.print(warning, markup=False, highlight=False, soft_wrap=True)
    print_table(out, compare_table(a, b))
    notes = config_notes(a, b)
    if not notes:
        out.print(
            "configuration: same dataset, model, queries, ground truth, sweeps and point parameters",
            highlight=False,
            soft_wrap=True,
        )
        return
    out.print(f"configuration differences ({len(notes)}):", highlight=False)
    for line in notes[:MAX_NOTES]:
        out.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    if len(notes) > MAX_NOTES:
        out.print(f"  ... and {len(notes) - MAX_NOTES} more", highlight=False)
