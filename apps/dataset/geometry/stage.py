"""The geometry stage (``geometry.json`` + manifest) and how its figures read in the card and the report.

The stage runs after the dataset, the queries and the ground truth (whose metric and nearest distances it
uses). Its dataset figures depend only on the dataset, the metric and the sample, so they go into the
dataset's card (``README.md``) as a ``## Geometry`` section, rewritten in place when the stage runs; the
queries' figures depend on the query set, which the dataset does not own (another run may bring other
queries to the same dataset), so they go into ``geometry.json`` and the benchmark report only.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

from apps.dataset.geometry.estimates import GeometryConfig, GeometryRecord, Metric, dataset_geometry
from apps.taskinfo import task_context
from core.format import num, table
from core.store import atomic_write_json, atomic_write_text, complete_manifest, file_entry

# 2: a given (imported or stored) dataset's queries and ground truth are measured too (1 left them out);
# every record is measured again once.
STAGE_VERSION = "2"
RECORD_FILE = "geometry.json"
CARD_HEADING = "## Geometry"
log = logging.getLogger(__name__)


def compute_geometry(
    out_dir: str,
    dataset_dir: str,
    queries_file: str | None,
    groundtruth_file: str | None,
    metric: Metric,
    config: GeometryConfig,
    *_upstream: Any,
) -> dict[str, Any]:
    """Write ``geometry.json`` and, last, ``manifest.json`` into ``out_dir``; return the manifest.

    A complete earlier output is returned as it is (``cached``). ``_upstream``: futures' values the DAG
    passes only to order the task after the dataset, queries and ground truth.
    """
    out = Path(out_dir)
    if (done := complete_manifest(out)) is not None:
        return {**done, "cached": True}
    started = time.time()
    record = dataset_geometry(dataset_dir, queries_file, groundtruth_file, metric, config)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / RECORD_FILE, record.model_dump(mode="json"))
    card = update_card(Path(dataset_dir), record)
    manifest = {
        "stage": "geometry",
        "version": STAGE_VERSION,
        "record": RECORD_FILE,
        "card_updated": card,
        "rows": record.sample_rows,
        "files": [file_entry(out / RECORD_FILE, RECORD_FILE)],
        **task_context(started),
    }
    atomic_write_json(out / "manifest.json", manifest)
    return manifest


def load_record(directory: str | Path) -> GeometryRecord | None:
    """The record of a complete geometry stage directory, or None."""
    path = Path(directory)
    if complete_manifest(path) is None:
        return None
    return GeometryRecord.model_validate_json((path / RECORD_FILE).read_text(encoding="utf-8"))


def _sample_line(record: GeometryRecord) -> str:
    groups = (
        f", {record.row_groups_read} of {record.row_groups_total} row groups read"
        if record.row_groups_total
        else ""
    )
    return (
        f"Sample: {record.sample_rows:,} of {record.dataset_rows:,} rows{groups}, seed {record.seed}; "
        f"metric {record.metric}, distances {record.distance}; {record.library}."
    )


def card_section(record: GeometryRecord) -> str:
    """The dataset card's ``## Geometry`` section (dataset figures only)."""
    lid = record.lid_dataset
    rows = [
        (
            f"LID, MLE (k = {record.k}): mean / median of the local estimates",
            f"{num(lid.mean)} / {num(lid.median)}",
        ),
        (f"LID, MLE (k = {record.k}): combined (harmonic mean)", num(lid.harmonic)),
        ("TwoNN", num(record.twonn_dataset)),
    ]
    estimates = "\n".join(table(["estimate", "value"], rows))
    return f"""{CARD_HEADING}

Intrinsic dimensionality of the vectors (the higher, the harder a graph index finds neighbours, so the
larger the `ef` a recall target needs). Written by the geometry stage of a run, or by
`python -m pipeline dataset geometry DATASET_DIR --write-card`.

{estimates}

{_sample_line(record)}
"""


def with_geometry(card: str, record: GeometryRecord) -> str:
    """``card`` with its ``## Geometry`` section replaced by (or, when absent, followed by) the record's."""
    section = card_section(record)
    pattern = re.compile(rf"^{re.escape(CARD_HEADING)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(card):
        return pattern.sub(lambda _m: section + "\n", card, count=1).rstrip() + "\n"
    return card.rstrip() + "\n\n" + section


def update_card(dataset_dir: Path, record: GeometryRecord) -> bool:
    """Put the geometry section into the dataset's README.md; False (logged) when it cannot be written.

    The card is not among the files the dataset's manifest verifies, so rewriting it never invalidates
    the dataset; a read-only dataset (someone else's) keeps its card and the figures stay in the report.
    """
    card = dataset_dir / "README.md"
    try:
        text = card.read_text(encoding="utf-8") if card.exists() else ""
        atomic_write_text(card, with_geometry(text, record))
    except OSError as exc:
        log.warning("geometry: could not update the dataset card %s: %s", card, exc)
        return False
    return True


def report_section(record: GeometryRecord | None) -> list[str]:
    """The benchmark report's ``## Dataset geometry`` section (empty when the stage did not run)."""
    if record is None:
        return []

    def lid(value: Any) -> str:
        return "—" if value is None else f"{num(value.mean)} / {num(value.median)} (n = {value.points:,})"

    rows = [
        (f"LID, MLE k = {record.k}, mean / median", lid(record.lid_dataset), lid(record.lid_queries)),
        ("TwoNN", num(record.twonn_dataset), num(record.twonn_queries)),
    ]
    if record.lid_queries_full is not None:
        rows.append(
            ("LID of queries over the whole dataset (ground truth)", "", lid(record.lid_queries_full))
        )
    contrast = (
        f"{num(record.relative_contrast)} (per-query median {num(record.relative_contrast_median)})"
        if record.relative_contrast is not None
        else "—"
    )
    source = {"groundtruth": "the ground truth (whole dataset)", "sample": "the data sample"}
    lines = [
        "## Dataset geometry",
        "",
        "A higher intrinsic dimension and a lower relative contrast make the search harder: a larger `ef` "
        "is needed for the same recall (the study's Lesson 2).",
        "",
        *table(["estimate", "dataset", "queries"], rows),
        "",
        f"Relative contrast (He et al. 2012: mean distance of a query to a random dataset point ÷ mean "
        f"distance to its nearest neighbour, over the queries): **{contrast}**; nearest distances from "
        f"{source.get(record.nn_source or '', '—')}.",
        "",
        _sample_line(record)
        + (f" Queries: {record.query_rows:,} of {record.queries_total:,}." if record.queries_total else ""),
        "",
    ]
    return lines


def summary_lines(record: GeometryRecord, name: str) -> list[str]:
    """A few console lines with the record's figures (``python -m pipeline dataset geometry``); LID's
    "combined" is the harmonic mean of the local estimates, the figure ``dataset synth`` compares."""

    def lid(value: Any) -> str:
        if value is None:
            return "—"
        return f"mean {num(value.mean)}, median {num(value.median)}, combined {num(value.harmonic)}"

    lines = [
        f"{name}: {_sample_line(record)}",
        f"  dataset: LID (MLE, k={record.k}) {lid(record.lid_dataset)}; TwoNN {num(record.twonn_dataset)}",
    ]
    if record.lid_queries is not None:
        full = f"; over the whole dataset {lid(record.lid_queries_full)}" if record.lid_queries_full else ""
        lines.append(
            f"  queries ({record.query_rows:,}): LID {lid(record.lid_queries)}{full}; "
            f"TwoNN {num(record.twonn_queries)}"
        )
        lines.append(
            f"  relative contrast (He et al. 2012): {num(record.relative_contrast)} "
            f"(per-query median {num(record.relative_contrast_median)}; nearest distances from "
            f"{record.nn_source})"
        )
    return lines
