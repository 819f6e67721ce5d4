"""``report.md``: Markdown tables shaped like the study's, with the figures embedded.

Deploy time, upload time, time to searchability, index time, write amplification, segments; QPS,
latency mean / P50 / P95 / P99 and recall per setting, with the best QPS at recall ≥ 0.95 marked. The
rows come from ``results.parquet`` (:mod:`apps.evaluate.results`), the figures from
:mod:`apps.report.figures`. A stage that failed shows as ``failed: <stage>: <reason>`` rows; it never stops
the report.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from apps.dataset.geometry.estimates import GeometryRecord
from apps.dataset.geometry.stage import report_section
from apps.evaluate.results import (
    ResultRows,
    insert_rate,
    is_ok,
    name_order,
    normalize_rows,
    point_name,
    read_results,
    sent_size,
)
from apps.evaluate.rules import MIN_RECALL, best_operating_point, operating_point, setting_order
from apps.report.engines import engines_section
from apps.report.figures import draw_figures
from apps.report.format import span
from apps.report.open_loop import open_loop_section
from apps.report.study import study_section
from apps.report.sweep import combine_repeats, points_section, repeats_section
from apps.report.telemetry import io_table, telemetry_section
from apps.vdb.stages.query_io import disturbed_note
from core.format import num, size, table
from core.store import atomic_write_text


def _failure(row: dict[str, Any]) -> str:
    return f"failed: {row['stage']}: {row.get('error') or 'no reason recorded'}"


# ---------------------------------------------------------------------------------------------------------
# report.md
# ---------------------------------------------------------------------------------------------------------


def summary_rows(run: ResultRows) -> list[dict[str, Any]]:
    """The summary's figures per point (label; the database without a sweep), repeats already folded.

    Each: ``name``, ``version``, ``best`` (the query row of the best QPS at recall ≥ 0.95, else the
    highest-recall row, else None), ``is_best``, ``reason`` (why there is no query row), and the
    ``insert``, ``index`` and ``deploy`` rows (None when absent). The report's summary table and the
    console's headline (``pipeline/headline.py``) both show these.
    """
    summary = []
    for db in run.databases:
        best, is_best = operating_point(run.queries(db))
        version = next(
            (r["server_version"] for r in run.rows if point_name(r) == db and r["server_version"]), None
        )
        reason = None
        if best is None:
            failed = run.failure(db)
            reason = _failure(failed) if failed else "no query results"
        summary.append(
            {
                "name": db,
                "version": version,
                "best": best,
                "is_best": is_best,
                "reason": reason,
                "insert": run.primary(db, "insert"),
                "index": run.primary(db, "index"),
                "deploy": run.primary(db, "deploy"),  # start -> every server healthy
            }
        )
    return summary


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`summary_rows` of result rows as the report shows them (each point's repeats: their median)."""
    folded, _spreads = combine_repeats(rows)
    return summary_rows(ResultRows(folded))


def _summary(run: ResultRows) -> list[str]:
    header = [
        "database",
        "server",
        "best setting",
        "recall",
        "QPS",
        "mean (ms)",
        "P99 (ms)",
        "upload (s)",
        "index (s)",
        "deploy (s)",
    ]
    body = []
    for row in summary_rows(run):
        best, insert, index, deploy = row["best"], row["insert"], row["index"], row["deploy"]
        times = [
            num(insert and insert["upload_s"]),
            num(index and index["index_s"]),
            num(deploy and deploy["deploy_s"]),
        ]
        if best is None:
            body.append([row["name"], row["version"] or "—", row["reason"], *["—"] * 4, *times])
            continue
        label = (
            f"**{best['setting']}**"
            if row["is_best"]
            else f"none at recall ≥ {MIN_RECALL} (highest recall: {best['setting']})"
        )
        body.append(
            [
                row["name"],
                row["version"] or "—",
                label,
                num(best["recall"], 3),
                num(best["qps"], 1),
                num(best["latency_mean_ms"]),
                num(best["p99_ms"]),
                *times,
            ]
        )
    return table(header, body)


def _ingest(run: ResultRows) -> list[str]:
    header = [
        "database",
        "vectors",
        "upload (s)",
        "searchable after last insert (s)",
        "insert (vectors/s)",
        "index (s)",
        "segments",
        "on disk",
        "write amplification",
    ]
    body = []
    for db in run.databases:
        insert, index = run.primary(db, "insert"), run.primary(db, "index")
        failed = run.failure(db, ("deploy", "insert", "index"))
        if insert is None and index is None:
            body.append([db, _failure(failed) if failed else "no insert results", *["—"] * 7])
            continue
        cells = [db]
        if insert is not None:
            cells += [
                num(insert["vectors"]),
                num(insert["upload_s"]),
                num(insert["searchable_s"]),
                num(insert_rate(insert), 0),
            ]
        else:
            cells += [_failure(failed) if failed else "—", "—", "—", "—"]
        if index is not None:
            amp = index["write_amplification"]
            cells += [
                num(index["index_s"]),
                num(index["segments"]),
                size(index["disk_bytes"]),
                "—" if amp is None else f"{amp:.2f}×",
            ]
        else:
            failed_index = run.failure(db, ("index",))
            cells += [_failure(failed_index) if failed_index else "—", "—", "—", "—"]
        body.append(cells)
    return table(header, body)


def _batch(row: dict[str, Any]) -> str:
    """The configured batch size, and the request size actually sent when it differs."""
    sent = sent_size(row)
    return num(row["batch_size"]) if sent is None else f"{num(row['batch_size'])} (sent {num(sent)})"


def _insert_sweep(run: ResultRows) -> list[str]:
    rows = [r for db in run.databases for r in run.of(db, "insert")]
    if len(rows) <= len(run.databases):
        return []
    header = [
        "database",
        "setting",
        "batch",
        "clients",
        "workers",
        "vectors",
        "upload (s)",
        "searchable (s)",
        "vectors/s",
    ]
    body = []
    for row in sorted(rows, key=lambda r: (name_order(point_name(r)), setting_order(r))):
        if not is_ok(row):
            body.append([point_name(row), row["setting"] or "—", _failure(row), *["—"] * 6])
            continue
        body.append(
            [
                point_name(row),
                row["setting"] or "—",
                _batch(row),
                num(row["clients"]),
                num(row["workers"]),
                num(row["vectors"]),
                num(row["upload_s"]),
                num(row["searchable_s"]),
                num(insert_rate(row), 0),
            ]
        )
    return ["### Insert sweep", "", *table(header, body), ""]


def _stall_warning(run: ResultRows) -> list[str]:
    """A warning line per stalled setting: its figures are shown, marked, and never picked as best."""
    lines = []
    for row in run.stalled():
        lines.append(
            f"> **Warning:** {row['database']} {row['setting']} stalled (a request timed out or took far "
            f"longer than the median, twice): its figures are not a normal measurement. {row['error'] or ''}"
        )
    return [*lines, ""] if lines else []


def _disturbed_warning(run: ResultRows) -> list[str]:
    """A warning naming the settings measured while other processes kept the client's host busy."""
    rows = [r for db in run.databases for r in run.queries(db)]
    note = disturbed_note(rows, lambda r: f"{point_name(r)} {r['setting']}")
    return [f"> **Warning:** {note[0].upper()}{note[1:]}.", ""] if note else []


def _rests_on(row: dict[str, Any]) -> str:
    """Queries the setting's QPS rests on (sent in its window) / the distinct queries its recall rests on."""
    return f"{num(row['queries_sent'])} / {num(row['distinct_queries'])}"


def _query_table(run: ResultRows) -> list[str]:
    stalls = bool(run.stalled())  # the `stalled` column only appears when a setting stalled
    header = [
        "database",
        "setting",
        "ef",
        "batch",
        "clients",
        "k",
        "QPS",
        "mean (ms)",
        "P50 (ms)",
        "P95 (ms)",
        "P99 (ms)",
        "recall",
        "queries sent / distinct",
        "window (s)",
        "best",
        *(["stalled"] if stalls else []),
    ]
    body = []
    blank = ["—"] * (len(header) - 3)
    for db in run.databases:
        rows = sorted(run.of(db, "query"), key=setting_order)
        best = best_operating_point(rows, MIN_RECALL)
        if not any(is_ok(r) for r in rows) and not any(r.get("stalled") for r in rows):
            failed = run.failure(db)
            body.append([db, "—", (_failure(failed) if failed else "no query results"), *blank])
            continue
        for row in rows:
            if not is_ok(row):
                stalled = ["**stalled**"] if row.get("stalled") else []
                body.append([db, row["setting"] or "—", _failure(row), *blank[: len(blank) - len(stalled)]])
                body[-1] += stalled
                continue
            cells = [
                num(row["qps"], 1),
                num(row["latency_mean_ms"]),
                num(row["p50_ms"]),
                num(row["p95_ms"]),
                num(row["p99_ms"]),
                num(row["recall"], 3),
            ]
            marked = row is best
            if marked:
                cells = [f"**{c}**" for c in cells]
            body.append(
                [
                    db,
                    row["setting"] or "—",
                    num(row["ef"]),
                    num(row["batch_size"]),
                    num(row["clients"]),
                    num(row["k"]),
                    *cells,
                    _rests_on(row),
                    num(row["window_s"]),
                    "**best**" if marked else "",
                    *((["**stalled**" if row.get("stalled") else ""]) if stalls else []),
                ]
            )
    return table(header, body)


def _insert_basis(run: ResultRows) -> list[str]:
    """What the insert figures rest on: one upload each, its rows and seconds."""
    rows = [r for db in run.databases for r in run.of(db, "insert") if is_ok(r)]
    if not rows:
        return []
    vectors = sum(r["vectors"] or 0 for r in rows)
    seconds = sum(r["upload_s"] or 0.0 for r in rows)
    return [
        f"Each insert figure rests on one upload (the vectors and upload seconds in its row): "
        f"{len(rows)} uploads, {vectors:,} vectors in {seconds:,.1f} s in all.",
        "",
    ]


def _query_basis(run: ResultRows) -> list[str]:
    """What the query figures rest on: queries sent and seconds per setting, distinct queries."""
    rows = [r for db in run.databases for r in run.of(db, "query") if is_ok(r) and r["window_s"]]
    if not rows:
        return []
    windows = [r["window_s"] for r in rows]
    sent = [r["queries_sent"] or 0 for r in rows]
    distinct = sorted({r["distinct_queries"] for r in rows if r["distinct_queries"] is not None})
    return [
        f"QPS and latency rest on every request of a setting's measured window (after its warm-up); "
        f"recall on the first answer to each distinct query. Per setting: {span(sent)} "
        f"queries sent in {span(windows, '{:,.1f}')} s; distinct queries: "
        f"{', '.join(f'{d:,}' for d in distinct) or '—'}.",
        "",
    ]


def write_report(
    results_path_or_rows: str | Path | Iterable[dict[str, Any]],
    out_dir: str | Path,
    title: str = "Vector database benchmark",
    telemetry: dict[str, Path] | None = None,
    geometry: GeometryRecord | None = None,
    mixed_figures: dict[str, Path] | None = None,
    dataset: str | None = None,
) -> dict[str, Any]:
    """Write ``report.md`` and its PNG figures into ``out_dir``; returns their paths.

    ``results_path_or_rows``: a ``results.parquet`` path or the rows themselves. Figures without data
    (e.g. no query result at all) are not drawn and the report says so. ``telemetry``: each database's
    ``telemetry.parquet`` (:mod:`apps.report.telemetry` adds its section and figures). ``geometry``: the
    dataset geometry stage's record, shown as its own section. ``mixed_figures``: caption -> figure of the
    mixed workload, drawn by the report stage (:mod:`apps.report.mixed`), linked after the study figures.
    ``dataset``: a line naming the dataset the figures rest on, shown under the title. Returns
    ``{"report": Path, "figures": {name: Path}}``.
    """
    if isinstance(results_path_or_rows, str | Path):
        source = f"`{Path(results_path_or_rows).name}`"
        rows = read_results(results_path_or_rows)
    else:
        source = "the stage results"
        rows = normalize_rows(results_path_or_rows)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    folded, spreads = combine_repeats(rows)  # repeats -> their median (the spread in its own section)
    run = ResultRows(folded)
    figures = draw_figures(run, out)

    lines = [f"# {title}", "", *([dataset, ""] if dataset else [])]
    lines.append(
        f"Made from {source}: {len(rows)} rows, databases: {', '.join(run.databases) or 'none'}. "
        f"Recall is tie-aware recall@k against the exact ground truth with distances recomputed from the "
        f"vectors; QPS is queries completed ÷ wall time of the query phase (a batch of B counts B); latency "
        f"is per request (one batch). The best operating point is the highest QPS among settings with "
        f"recall ≥ {MIN_RECALL} (marked **best**)."
    )
    lines.append("")
    for key, values in run.provenance().items():
        if values:
            lines.append(f"- {key}: " + ", ".join(f"`{v}`" for v in values))
    lines += ["", *points_section(rows), *engines_section(rows)]
    lines += [f"## Summary (best QPS at recall ≥ {MIN_RECALL})", "", *_summary(run), ""]
    lines += report_section(geometry)
    lines += ["## Upload and index", "", *_insert_basis(run), *_ingest(run), "", *_insert_sweep(run)]
    lines += ["## Query sweep", "", *_query_basis(run), *_stall_warning(run), *_disturbed_warning(run)]
    lines += [*_query_table(run), ""]
    lines += io_table(run)
    lines += repeats_section(spreads)
    lines += ["## Figures", ""]
    captions = {
        "recall_qps": (
            "Recall versus QPS per database: every setting, the Pareto frontier, "
            f"★ the best QPS at recall ≥ {MIN_RECALL}"
        ),
        "insert_throughput": "Insert throughput versus batch size",
        "latency": "Latency mean / P50 / P95 / P99 at each database's operating point",
    }
    for name, caption in captions.items():
        if name in figures:
            lines += [f"![{caption}]({figures[name].name})", ""]
        else:
            lines += [f"_{caption}: not drawn, no data._", ""]
    study, drawn = study_section(rows, out)  # every repeat: medians with min–max bars
    lines += study
    figures.update(drawn)
    open_lines, drawn = open_loop_section(rows, out)  # every repeat: the knee per repeat
    lines += open_lines
    figures.update(drawn)
    for caption, path in (mixed_figures or {}).items():
        lines += [f"![{caption}: latency of every request and rows acknowledged over time]({path.name})", ""]
    if telemetry:
        section, drawn = telemetry_section(telemetry, out)
        lines += section
        figures.update(drawn)
    report = out / "report.md"
    atomic_write_text(report, "\n".join(lines).rstrip() + "\n")
    return {"report": report, "figures": figures}
