"""The report stage: ``results.parquet`` (typed, one row per database × stage × setting) and ``report.md``.

:func:`write_results` writes the rows the stages produced under the fixed :data:`RESULTS_SCHEMA`
(absent values are typed nulls, so an empty or partial run has the same schema as a full one).
:func:`write_report` turns them into Markdown tables shaped like the study's (upload time, time to
searchability, index time, write amplification, segments; QPS, latency mean / P50 / P95 / P99 and recall
per setting, with the best QPS at recall ≥ 0.95 marked) and PNG figures made with matplotlib's Agg
canvas (no pyplot global state): the recall–QPS frontier, insert throughput versus batch size and the
latency percentiles at each database's operating point. A stage that failed shows as
``failed: <stage>: <reason>`` rows; it never stops the report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from apps.vdb_metrics import best_operating_point
from core.store import atomic_write_text, write_parquet_atomic

STAGES = ("deploy", "insert", "index", "query", "mixed")
MIN_RECALL = 0.95

RESULTS_SCHEMA = pa.schema(
    [
        # identity
        pa.field("database", pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),  # deploy | insert | index | query | mixed
        pa.field("setting", pa.string()),  # e.g. "ef=64,batch=32,clients=2,k=10"; null for deploy
        pa.field("status", pa.string(), nullable=False),  # ok | failed | skipped
        pa.field("error", pa.string()),  # the reason when status != ok
        # deploy
        pa.field("deploy_s", pa.float64()),  # start -> healthy
        # insert
        pa.field("vectors", pa.int64()),  # vectors inserted
        pa.field("upload_s", pa.float64()),  # first insert request sent -> every vector visible (upload time)
        pa.field("searchable_s", pa.float64()),  # last insert acknowledged -> every vector visible
        pa.field("insert_vectors_per_s", pa.float64()),
        # index
        pa.field("index_s", pa.float64()),  # build triggered -> steady state
        pa.field("segments", pa.int64()),
        pa.field("disk_bytes", pa.int64()),
        pa.field("write_amplification", pa.float64()),  # disk bytes / raw float32 bytes
        # query (apps.vdb_metrics.evaluate)
        pa.field("qps", pa.float64()),
        pa.field("latency_mean_ms", pa.float64()),
        pa.field("p50_ms", pa.float64()),
        pa.field("p95_ms", pa.float64()),
        pa.field("p99_ms", pa.float64()),
        pa.field("recall", pa.float64()),  # mean tie-aware recall@k
        pa.field("recall_min", pa.float64()),
        pa.field("queries", pa.int64()),
        pa.field("requests", pa.int64()),
        pa.field("duration_s", pa.float64()),
        pa.field("unknown_ids", pa.int64()),
        # parameters
        pa.field("k", pa.int32()),
        pa.field("ef", pa.int32()),
        pa.field("batch_size", pa.int32()),
        pa.field("clients", pa.int32()),
        pa.field("workers", pa.int32()),
        pa.field("params", pa.string()),  # JSON: collection parameters, adapter settings
        pa.field("server_version", pa.string()),
        # provenance
        pa.field("dataset_key", pa.string()),
        pa.field("queries_key", pa.string()),
        pa.field("groundtruth_key", pa.string()),
        pa.field("run_id", pa.string()),
    ]
)


def _coerce(value: Any, field: pa.Field) -> Any:
    """One value -> the Python value of the field's type; None, NaN-free ints, JSON for dict params."""
    if value is None:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    kind = field.type
    if pa.types.is_string(kind):
        if isinstance(value, dict | list):
            return json.dumps(value, sort_keys=True, default=str)
        return str(value)
    if pa.types.is_integer(kind):
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"results: {field.name}={value!r} is not an integer")
        return int(value)
    if pa.types.is_floating(kind):
        return float(value)
    return value


def normalize_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check and coerce result rows to :data:`RESULTS_SCHEMA`; every column present (None if absent).

    Raises ValueError for an unknown column (names the allowed ones), an unknown stage or a missing
    database. ``status`` defaults to ``failed`` when an ``error`` is given, else ``ok``.
    """
    names = set(RESULTS_SCHEMA.names)
    out = []
    for number, row in enumerate(rows):
        unknown = sorted(set(row) - names)
        if unknown:
            raise ValueError(
                f"results row {number}: unknown columns {unknown}; allowed: {RESULTS_SCHEMA.names}"
            )
        if not row.get("database"):
            raise ValueError(f"results row {number}: no database")
        if row.get("stage") not in STAGES:
            raise ValueError(f"results row {number}: stage {row.get('stage')!r} is not one of {STAGES}")
        clean = {field.name: _coerce(row.get(field.name), field) for field in RESULTS_SCHEMA}
        if clean["status"] is None:
            clean["status"] = "failed" if clean["error"] else "ok"
        out.append(clean)
    return out


def results_table(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Rows -> a table with exactly :data:`RESULTS_SCHEMA` (an empty list gives an empty typed table)."""
    clean = normalize_rows(rows)
    return pa.Table.from_pylist(clean, schema=RESULTS_SCHEMA) if clean else RESULTS_SCHEMA.empty_table()


def write_results(rows: Iterable[dict[str, Any]], path: str | Path) -> dict[str, Any]:
    """Write ``results.parquet`` atomically; returns ``{rows, bytes, sha256}`` for the manifest."""
    return write_parquet_atomic(results_table(rows), Path(path), row_group_rows=65536)


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``results.parquet`` (columns added to the schema later read as None)."""
    table = pq.read_table(path)
    return normalize_rows(
        {k: v for k, v in row.items() if k in RESULTS_SCHEMA.names} for row in table.to_pylist()
    )


# ---------------------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------------------


def _num(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _bytes(value: int | None) -> str:
    if value is None:
        return "—"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)


def _cell(text: str) -> str:
    """Safe inside a Markdown table cell: one line, no pipes, bounded length."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= 240 else text[:237] + "..."


def _failure(row: dict[str, Any]) -> str:
    return f"failed: {row['stage']}: {row.get('error') or 'no reason recorded'}"


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in body]
    return lines


def _ok(row: dict[str, Any]) -> bool:
    return row["status"] == "ok"


def _throughput(row: dict[str, Any]) -> float | None:
    if row["insert_vectors_per_s"] is not None:
        return row["insert_vectors_per_s"]
    if row["vectors"] and row["upload_s"]:
        return row["vectors"] / row["upload_s"]
    return None


def _param_sort(row: dict[str, Any]) -> tuple:
    def key(value: Any) -> float:
        return -1 if value is None else value

    return (key(row["k"]), key(row["batch_size"]), key(row["clients"]), key(row["ef"]), row["setting"] or "")


def _operating_point(rows: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, bool]:
    """(row, is_best): the best QPS at recall ≥ 0.95, else the highest-recall setting (is_best False)."""
    best = best_operating_point(rows, MIN_RECALL)
    if best is not None:
        return best, True
    usable = [r for r in rows if _ok(r) and r["recall"] is not None and r["qps"] is not None]
    if not usable:
        return None, False
    return max(usable, key=lambda r: (r["recall"], r["qps"])), False


class _Run:
    """The rows of one results file grouped by database and stage."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.databases = sorted({r["database"] for r in rows})

    def of(self, database: str, stage: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["database"] == database and r["stage"] == stage]

    def failure(self, database: str, stages: Sequence[str] = STAGES) -> dict[str, Any] | None:
        """The first failed row of ``database`` in pipeline order among ``stages``."""
        for stage in stages:
            for row in self.of(database, stage):
                if row["status"] == "failed":
                    return row
        return None

    def queries(self, database: str) -> list[dict[str, Any]]:
        return sorted((r for r in self.of(database, "query") if _ok(r)), key=_param_sort)

    def primary(self, database: str, stage: str) -> dict[str, Any] | None:
        """The ok row of a stage: the one matching the index setting, else the last."""
        rows = [r for r in self.of(database, stage) if _ok(r)]
        if not rows:
            return None
        index = [r for r in self.of(database, "index") if _ok(r)]
        for row in rows:
            if index and row["setting"] is not None and row["setting"] == index[-1]["setting"]:
                return row
        return rows[-1]

    def provenance(self) -> dict[str, list[str]]:
        keys = ("run_id", "dataset_key", "queries_key", "groundtruth_key")
        return {k: sorted({r[k] for r in self.rows if r[k]}) for k in keys}


# ---------------------------------------------------------------------------------------------------------
# Figures (matplotlib Agg canvas, no pyplot)
# ---------------------------------------------------------------------------------------------------------


def _figure(width: float = 7.0, height: float = 4.6):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(figure)
    return figure


def _colors(databases: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    palette = colormaps["tab10"].colors
    return {db: palette[i % len(palette)] for i, db in enumerate(databases)}


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    figure.savefig(tmp, format="png", metadata={"Software": None})
    tmp.replace(path)
    return path


def pareto_frontier(points: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """(recall, qps) points that no other point beats on both; sorted by recall ascending."""
    frontier: list[tuple[float, float]] = []
    best_qps = -math.inf
    for recall, q in sorted(points, key=lambda p: (-p[0], -p[1])):
        if q > best_qps:
            frontier.append((recall, q))
            best_qps = q
    return frontier[::-1]


def _plot_recall_qps(run: _Run, colors: dict[str, Any], path: Path) -> Path | None:
    series = {
        db: [(r["recall"], r["qps"], r) for r in run.queries(db) if r["recall"] is not None and r["qps"]]
        for db in run.databases
    }
    if not any(series.values()):
        return None
    figure = _figure()
    axes = figure.add_subplot()
    all_qps = []
    for db, points in series.items():
        if not points:
            continue
        color = colors[db]
        recalls = [p[0] for p in points]
        rates = [p[1] for p in points]
        all_qps += rates
        axes.scatter(recalls, rates, color=color, alpha=0.45, s=22, label=f"{db}: all settings")
        frontier = pareto_frontier(zip(recalls, rates, strict=True))
        axes.plot(
            [f[0] for f in frontier],
            [f[1] for f in frontier],
            "-o",
            color=color,
            ms=4,
            label=f"{db}: Pareto frontier",
        )
        best = best_operating_point([p[2] for p in points], MIN_RECALL)
        if best is not None:
            axes.scatter(
                [best["recall"]], [best["qps"]], marker="*", s=220, color=color, edgecolor="black", zorder=5
            )
            axes.annotate(
                best["setting"] or "",
                (best["recall"], best["qps"]),
                textcoords="offset points",
                xytext=(-8, 8),
                ha="right",
                fontsize=7,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "alpha": 0.85, "lw": 0},
            )
    axes.axvline(MIN_RECALL, color="grey", ls="--", lw=1)
    axes.text(
        MIN_RECALL,
        1.0,
        f" recall {MIN_RECALL}",
        transform=axes.get_xaxis_transform(),
        va="top",
        fontsize=8,
        color="grey",
    )
    if all_qps and max(all_qps) / max(min(all_qps), 1e-12) > 20:
        axes.set_yscale("log")
    axes.set_xlabel("recall@k (tie-aware)")
    axes.set_ylabel("QPS (queries / s)")
    axes.set_title("Recall versus QPS (★ best QPS at recall ≥ 0.95)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    return _save(figure, path)


def _plot_insert(run: _Run, colors: dict[str, Any], path: Path) -> Path | None:
    groups: dict[tuple[str, Any], list[tuple[int, float]]] = {}
    for db in run.databases:
        for row in run.of(db, "insert"):
            rate = _throughput(row)
            if _ok(row) and row["batch_size"] and rate:
                groups.setdefault((db, row["clients"]), []).append((row["batch_size"], rate))
    if not groups:
        return None
    figure = _figure()
    axes = figure.add_subplot()
    styles = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]
    clients_seen = sorted({c for _, c in groups if c is not None})
    batches = set()
    for (db, clients), points in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1] or 0)):
        points.sort()
        batches.update(p[0] for p in points)
        style, marker = (
            styles[clients_seen.index(clients) % len(styles)] if clients is not None else styles[0]
        )
        label = db if clients is None else f"{db}, {clients} client{'s' if clients != 1 else ''}"
        axes.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            style,
            marker=marker,
            color=colors[db],
            label=label,
        )
    if len(batches) > 1:
        axes.set_xscale("log", base=2)
    axes.set_xticks(sorted(batches), [str(b) for b in sorted(batches)])
    axes.set_xlabel("insert batch size (vectors per request)")
    axes.set_ylabel("insert throughput (vectors / s)")
    axes.set_title("Insert throughput versus batch size")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    return _save(figure, path)


def _plot_latency(run: _Run, colors: dict[str, Any], path: Path) -> Path | None:
    chosen = []
    for db in run.databases:
        row, is_best = _operating_point(run.queries(db))
        if row is not None and row["latency_mean_ms"] is not None:
            chosen.append((db, row, is_best))
    if not chosen:
        return None
    figure = _figure()
    axes = figure.add_subplot()
    stats = [("latency_mean_ms", "mean"), ("p50_ms", "P50"), ("p95_ms", "P95"), ("p99_ms", "P99")]
    width = 0.8 / len(stats)
    shades = [0.35, 0.55, 0.75, 1.0]
    x = np.arange(len(chosen))
    for i, (key, label) in enumerate(stats):
        values = [row[key] if row[key] is not None else 0.0 for _, row, _ in chosen]
        bars = axes.bar(
            x + (i - (len(stats) - 1) / 2) * width,
            values,
            width,
            color=[colors[db] for db, _, _ in chosen],
            alpha=shades[i],
            edgecolor="black",
            lw=0.5,
            label=label,
        )
        axes.bar_label(bars, fmt="%.1f", fontsize=6, padding=1)
    axes.set_xticks(
        x,
        [f"{db}\n{row['setting']}{'' if best else ' (recall < 0.95)'}" for db, row, best in chosen],
        fontsize=7,
    )
    axes.set_ylabel("request latency (ms)")
    axes.set_title("Latency per request at each database's operating point")
    axes.grid(alpha=0.3, axis="y")
    from matplotlib.patches import Patch

    handles = [Patch(facecolor="grey", alpha=a, edgecolor="black", lw=0.5) for a in shades]
    axes.legend(handles, [s[1] for s in stats], fontsize=7, title="bar shade", title_fontsize=7)
    return _save(figure, path)


# ---------------------------------------------------------------------------------------------------------
# report.md
# ---------------------------------------------------------------------------------------------------------


def _summary(run: _Run) -> list[str]:
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
    ]
    body = []
    for db in run.databases:
        queries = run.queries(db)
        best, is_best = _operating_point(queries)
        insert, index = run.primary(db, "insert"), run.primary(db, "index")
        version = next(
            (r["server_version"] for r in run.rows if r["database"] == db and r["server_version"]), None
        )
        if best is None:
            failed = run.failure(db)
            reason = _failure(failed) if failed else "no query results"
            body.append(
                [
                    db,
                    version or "—",
                    reason,
                    "—",
                    "—",
                    "—",
                    "—",
                    _num(insert and insert["upload_s"]),
                    _num(index and index["index_s"]),
                ]
            )
            continue
        label = (
            f"**{best['setting']}**"
            if is_best
            else f"none at recall ≥ {MIN_RECALL} (highest recall: {best['setting']})"
        )
        body.append(
            [
                db,
                version or "—",
                label,
                _num(best["recall"], 3),
                _num(best["qps"], 1),
                _num(best["latency_mean_ms"]),
                _num(best["p99_ms"]),
                _num(insert and insert["upload_s"]),
                _num(index and index["index_s"]),
            ]
        )
    return _table(header, body)


def _ingest(run: _Run) -> list[str]:
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
                _num(insert["vectors"]),
                _num(insert["upload_s"]),
                _num(insert["searchable_s"]),
                _num(_throughput(insert), 0),
            ]
        else:
            cells += [_failure(failed) if failed else "—", "—", "—", "—"]
        if index is not None:
            amp = index["write_amplification"]
            cells += [
                _num(index["index_s"]),
                _num(index["segments"]),
                _bytes(index["disk_bytes"]),
                "—" if amp is None else f"{amp:.2f}×",
            ]
        else:
            failed_index = run.failure(db, ("index",))
            cells += [_failure(failed_index) if failed_index else "—", "—", "—", "—"]
        body.append(cells)
    return _table(header, body)


def _insert_sweep(run: _Run) -> list[str]:
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
    for row in sorted(rows, key=lambda r: (r["database"], _param_sort(r))):
        if not _ok(row):
            body.append([row["database"], row["setting"] or "—", _failure(row), *["—"] * 6])
            continue
        body.append(
            [
                row["database"],
                row["setting"] or "—",
                _num(row["batch_size"]),
                _num(row["clients"]),
                _num(row["workers"]),
                _num(row["vectors"]),
                _num(row["upload_s"]),
                _num(row["searchable_s"]),
                _num(_throughput(row), 0),
            ]
        )
    return ["### Insert sweep", "", *_table(header, body), ""]


def _query_table(run: _Run, stage: str = "query") -> list[str]:
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
        "best",
    ]
    body = []
    for db in run.databases:
        rows = sorted(run.of(db, stage), key=_param_sort)
        if stage != "query" and not rows:
            continue
        best = best_operating_point(rows, MIN_RECALL) if stage == "query" else None
        if not any(_ok(r) for r in rows):
            failed = run.failure(db)
            body.append([db, "—", (_failure(failed) if failed else "no query results"), *["—"] * 10])
            continue
        for row in rows:
            if not _ok(row):
                body.append([db, row["setting"] or "—", _failure(row), *["—"] * 10])
                continue
            cells = [
                _num(row["qps"], 1),
                _num(row["latency_mean_ms"]),
                _num(row["p50_ms"]),
                _num(row["p95_ms"]),
                _num(row["p99_ms"]),
                _num(row["recall"], 3),
            ]
            marked = row is best
            if marked:
                cells = [f"**{c}**" for c in cells]
            body.append(
                [
                    db,
                    row["setting"] or "—",
                    _num(row["ef"]),
                    _num(row["batch_size"]),
                    _num(row["clients"]),
                    _num(row["k"]),
                    *cells,
                    "**best**" if marked else "",
                ]
            )
    return _table(header, body)


def write_report(
    results_path_or_rows: str | Path | Iterable[dict[str, Any]],
    out_dir: str | Path,
    title: str = "Vector database benchmark",
) -> dict[str, Any]:
    """Write ``report.md`` and its PNG figures into ``out_dir``; returns their paths.

    ``results_path_or_rows``: a ``results.parquet`` path or the rows themselves. Figures without data
    (e.g. no query result at all) are not drawn and the report says so. Returns
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
    run = _Run(rows)
    colors = _colors(run.databases)
    figures = {
        name: path
        for name, path in {
            "recall_qps": _plot_recall_qps(run, colors, out / "recall_qps.png"),
            "insert_throughput": _plot_insert(run, colors, out / "insert_throughput.png"),
            "latency": _plot_latency(run, colors, out / "latency.png"),
        }.items()
        if path is not None
    }

    lines = [f"# {title}", ""]
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
    lines += ["", "## Summary (best QPS at recall ≥ 0.95)", "", *_summary(run), ""]
    lines += ["## Upload and index", "", *_ingest(run), "", *_insert_sweep(run)]
    lines += ["## Query sweep", "", *_query_table(run), ""]
    if any(r["stage"] == "mixed" for r in rows):
        lines += ["## Mixed insert + query", "", *_query_table(run, "mixed"), ""]
    lines += ["## Figures", ""]
    captions = {
        "recall_qps": (
            "Recall versus QPS per database: every setting, the Pareto frontier, "
            "★ the best QPS at recall ≥ 0.95"
        ),
        "insert_throughput": "Insert throughput versus batch size",
        "latency": "Latency mean / P50 / P95 / P99 at each database's operating point",
    }
    for name, caption in captions.items():
        if name in figures:
            lines += [f"![{caption}]({figures[name].name})", ""]
        else:
            lines += [f"_{caption}: not drawn, no data._", ""]
    report = out / "report.md"
    atomic_write_text(report, "\n".join(lines).rstrip() + "\n")
    return {"report": report, "figures": figures}
