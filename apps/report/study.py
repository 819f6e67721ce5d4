"""The study's figures (000 §V), drawn from a sweep's result rows when the sweep has the axis each needs.

Every figure plots, per line, the median over repeats of one metric against one sweep axis, with min–max
error bars, from the unfolded rows of ``results.parquet`` (one per point × stage × setting × repeat).
Figures (file stem: stage, x axis, matched by the swept parameter's name):

- ``study_insert_clients``: insert rows' ``clients`` (``insert.clients_per_worker`` × ``insert.workers``);
- ``study_insert_workers``: server workers/nodes (``weaviate.nodes``, ``cluster.workers``, ``cluster.nodes``,
  ``cluster.milvus.proxies`` and the other Milvus roles, also under ``cluster.overrides.<db>``) or
  ``insert.workers``;
- ``study_index_cores``: index rows against ``cores_per_worker`` / ``cluster.cores_per_worker`` /
  ``<db>.gomaxprocs`` / ``<db>.env.GOMAXPROCS``;
- ``study_query_cores``: QPS and mean latency against that cores axis;
- ``study_query_workers``: QPS against the server workers/nodes axis;
- ``study_index_rows``, ``study_query_rows``: index time, and query time and recall, against the rows loaded
  (``insert.rows``: 001 Figs. 3 and 5, one line per other swept value, e.g. the workers);
- ``study_segments``: recall and search time (mean latency) against a segment setting
  (``qdrant.default_segment_number``, ``qdrant.max_segment_size_kb``,
  ``milvus.config_overrides.dataCoord.segment.maxSize``), labelled with the segments counted after indexing.

A line is one database entry (its label without the swept values) with the other swept parameters fixed;
a parameter swept together with the x axis (``sweep: zip``) joins the axis instead. Query figures use one
query setting per line, named in its legend: the highest-QPS setting that reaches recall ≥ 0.95 at every
point of the line, else the setting with the highest lowest recall. A line with one x value is drawn as a
marker when its entry has others (the study's unbound point, ``bind: none``, beside its core counts). A
figure whose axis was not swept (no entry with two x values) is skipped and listed. :func:`mixed_table`
adds the mixed-workload degradation table (000 Table VII) from rows with ``stage`` ``mixed`` and
``mixed_baseline``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.evaluate.results import insert_rate, point_name
from apps.evaluate.rules import MIN_RECALL, choose_operating_point, spread
from apps.report.figures import colors_for, new_figure, save_figure
from apps.report.format import span
from apps.report.mixed import mixed_table
from apps.vdb import DATABASES, database

SERVER_WORKERS = ("nodes", "workers", "proxies", "streaming_nodes", "query_nodes", "data_nodes")
CORES = ("cores_per_worker", "gomaxprocs")
Row = dict[str, Any]


def _last(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def is_server_workers(name: str) -> bool:
    """A swept parameter setting the number of database workers, nodes or Milvus role processes."""
    return _last(name) in SERVER_WORKERS and not name.startswith(("insert.", "query."))


def is_workers(name: str) -> bool:
    """Server workers, or the insert tasks the rows are partitioned across (``insert.workers``)."""
    return is_server_workers(name) or name == "insert.workers"


def is_cores(name: str) -> bool:
    """A swept parameter setting the cores (or Go threads) of each database worker."""
    return _last(name).lower() in CORES


def is_segments(name: str) -> bool:
    """A swept parameter setting the segment count or size (not Milvus's indexing threshold)."""
    return "segment" in name.lower() and "min_segment_rows" not in name


def is_rows(name: str) -> bool:
    """The rows a point loads (``vdb.insert.rows``): the dataset-size axis (001 Figs. 3 and 5)."""
    return name == "insert.rows"


@dataclass(frozen=True)
class Spec:
    """One study figure: the rows it draws, its x axis and its panels (metric column, y label)."""

    name: str
    title: str
    stage: str
    axis: Callable[[str], bool] | None  # a swept parameter's name -> is the x axis; None: `clients`
    panels: tuple[tuple[str, str], ...]
    needs: str  # the sweep axis it needs, as the report says when it is skipped
    absorbs: tuple[str, ...] = ()  # parameters that make up the x axis (never split lines)


SPECS = (
    Spec(
        "study_insert_clients",
        "Insert throughput versus insert clients",
        "insert",
        None,
        (("insert_rate", "insert throughput (vectors / s)"),),
        "insert clients (vdb.insert.clients_per_worker or insert.workers as a list)",
        ("insert.clients_per_worker", "insert.workers"),
    ),
    Spec(
        "study_insert_workers",
        "Insert throughput versus workers",
        "insert",
        is_workers,
        (("insert_rate", "insert throughput (vectors / s)"),),
        "workers or nodes (weaviate.nodes, vdb.cluster.workers, milvus roles, vdb.insert.workers)",
    ),
    Spec(
        "study_index_cores",
        "Index time versus cores per worker",
        "index",
        is_cores,
        (("index_s", "index time (s)"),),
        "cores per worker (vdb.cores_per_worker or vdb.cluster.cores_per_worker as a list)",
    ),
    Spec(
        "study_query_cores",
        "QPS and latency versus cores per worker",
        "query",
        is_cores,
        (("qps", "QPS (queries / s)"), ("latency_mean_ms", "mean latency per request (ms)")),
        "cores per worker (vdb.cores_per_worker or vdb.cluster.cores_per_worker as a list)",
    ),
    Spec(
        "study_query_workers",
        "QPS versus workers",
        "query",
        is_server_workers,
        (("qps", "QPS (queries / s)"),),
        "server workers or nodes (weaviate.nodes, vdb.cluster.workers, milvus roles)",
    ),
    Spec(
        "study_index_rows",
        "Index time versus dataset size",
        "index",
        is_rows,
        (("index_s", "index time (s)"),),
        "dataset size (vdb.insert.rows as a list)",
    ),
    Spec(
        "study_query_rows",
        "Query time and recall versus dataset size",
        "query",
        is_rows,
        (("latency_mean_ms", "query time: mean latency per request (ms)"), ("recall", "recall@k")),
        "dataset size (vdb.insert.rows as a list)",
    ),
    Spec(
        "study_segments",
        "Recall and search time versus segments",
        "query",
        is_segments,
        (("recall", "recall@k"), ("latency_mean_ms", "search time: mean latency per request (ms)")),
        "a segment setting (qdrant default_segment_number / max_segment_size_kb, milvus segment size)",
    ),
)


@dataclass(frozen=True)
class Point:
    """One x of a line: the median over its measurements (one per repeat) and their range."""

    x: float
    median: float
    low: float
    high: float
    repeats: int


@dataclass(frozen=True)
class Series:
    """One line of one panel: ``metric`` against the figure's axis."""

    line: str
    metric: str
    points: tuple[Point, ...]
    entry: str = ""  # the database entry (its colour)


@dataclass(frozen=True)
class FigureData:
    """What a figure plots and rests on (for its caption)."""

    spec: Spec
    axis: str  # the x axis' parameter name(s)
    series: tuple[Series, ...]
    rows: list[Row]  # the rows plotted
    zipped: tuple[str, ...]  # parameters swept together with the axis

    def of(self, metric: str) -> list[Series]:
        """The lines of one panel."""
        return [s for s in self.series if s.metric == metric]


def _value(row: Row, metric: str) -> float | None:
    return insert_rate(row) if metric == "insert_rate" else row.get(metric)


def _base(row: Row) -> str:
    """The entry's name without its swept values: ``weaviate[nodes=2]`` -> ``weaviate``."""
    return re.sub(r"\[.*\]$", "", point_name(row))


def _x_of(spec: Spec, row: Row) -> tuple[str, float] | None:
    if spec.axis is None:
        return ("clients", row["clients"]) if row.get("clients") is not None else None
    for name, value in (row.get("sweep") or {}).items():
        if spec.axis(name) and not isinstance(value, bool):
            try:  # numbers, or numbers written as text (an env value: GOMAXPROCS "4")
                return name, float(value)
            except (TypeError, ValueError):
                continue
    return None


def _zipped(items: list[tuple[Row, str, float]], absorbs: Sequence[str]) -> set[str]:
    """Parameters that follow the x axis within an entry (one value per x, several in all): ``zip``."""
    out: set[str] = set(absorbs)
    by_base: dict[str, list[tuple[Row, str, float]]] = {}
    for item in items:
        by_base.setdefault(_base(item[0]), []).append(item)
    for group in by_base.values():
        names = {n for row, axis, _ in group for n in (row.get("sweep") or {}) if n != axis}
        for name in names:
            per_x: dict[float, set] = {}
            for row, _, x in group:
                per_x.setdefault(x, set()).add(repr((row.get("sweep") or {}).get(name)))
            values = set().union(*per_x.values())
            if len(values) > 1 and all(len(v) == 1 for v in per_x.values()):
                out.add(name)
    return out


def _stats(values_by_x: dict[float, list[tuple[Any, float]]]) -> tuple[Point, ...]:
    points = []
    for x in sorted(values_by_x):
        members = values_by_x[x]
        middle, low, high = spread([v for _, v in members])
        points.append(Point(x, middle, low, high, len({m for m, _ in members})))
    return tuple(points)


def _fixed_setting(rows: list[Row]) -> str | None:
    """The line's query setting: highest QPS at recall ≥ 0.95 at every x, else highest lowest recall
    (:func:`apps.evaluate.rules.choose_operating_point`)."""
    by_setting: dict[str, dict[float, list[Row]]] = {}
    for row in rows:
        by_setting.setdefault(row["setting"] or "", {}).setdefault(row["_x"], []).append(row)
    if not by_setting:
        return None
    widest = max(len(v) for v in by_setting.values())  # settings measured at every x (or at most)
    candidates = {s: v for s, v in by_setting.items() if len(v) == widest}

    def medians(per_x: dict[float, list[Row]], metric: str) -> list[float]:
        values = ([r[metric] for r in rs if r.get(metric) is not None] for rs in per_x.values())
        return [spread(v).median if v else 0.0 for v in values]  # type: ignore[union-attr]

    # The operating-point rule over whole lines: a setting's recall is its lowest over x, its QPS the sum.
    setting, _ = choose_operating_point(
        candidates,
        recall=lambda s: min(medians(candidates[s], "recall")),
        qps=lambda s: sum(medians(candidates[s], "qps")),
        tiebreak=lambda s: s,
    )
    return setting


def figure_data(rows: Iterable[Row], spec: Spec) -> FigureData | None:
    """The lines ``spec`` plots from ``rows`` (every repeat), or None when the sweep lacks its axis."""
    metrics = [m for m, _ in spec.panels]
    items: list[tuple[Row, str, float]] = []
    for row in rows:
        if row.get("stage") != spec.stage or row.get("status") != "ok" or row.get("stalled"):
            continue
        found = _x_of(spec, row)
        if found is not None and all(_value(row, m) is not None for m in metrics):
            items.append((row, found[0], float(found[1])))
    zipped = _zipped(items, spec.absorbs)
    lines: dict[str, list[Row]] = {}
    batches: dict[str, set] = {}
    for row, _, _ in items:
        batches.setdefault(_base(row), set()).add(row.get("batch_size"))
    for row, axis, x in items:
        fixed = {k: v for k, v in (row.get("sweep") or {}).items() if k != axis and k not in zipped}
        parts = [f"{_last(k)}={v}" for k, v in sorted(fixed.items())]
        if spec.stage == "insert" and len(batches[_base(row)]) > 1:
            parts.append(f"batch={row.get('batch_size')}")
        line = _base(row) + (f" ({', '.join(parts)})" if parts else "")
        lines.setdefault(line, []).append({**row, "_x": x, "_axis": axis})
    series: list[Series] = []
    used: list[Row] = []
    entry_xs: dict[str, set[float]] = {}
    for members in lines.values():
        entry_xs.setdefault(_base(members[0]), set()).update(r["_x"] for r in members)
    entry_setting: dict[str, str | None] = {}
    # Lines over several x first: a one-point line of the same entry (the study's "unbound" beside its core
    # counts, bind: none) is drawn as a marker beside them, at their query setting where it has it.
    for line, members in sorted(lines.items(), key=lambda kv: (-len({r["_x"] for r in kv[1]}), kv[0])):
        entry = _base(members[0])
        if len(entry_xs[entry]) < 2:
            continue
        if spec.stage == "query":
            setting = entry_setting.get(entry)
            one_point = len({r["_x"] for r in members}) == 1
            if not one_point or setting not in {r["setting"] or "" for r in members}:
                setting = _fixed_setting(members)  # a line over several x: its own best setting
            entry_setting.setdefault(entry, setting)
            members = [r for r in members if (r["setting"] or "") == setting]
            line = f"{line} @ {setting}"
        used += members
        for metric in metrics:
            by_x: dict[float, list[tuple[Any, float]]] = {}
            for r in members:
                by_x.setdefault(r["_x"], []).append(((r["label"], r["repeat"]), _value(r, metric)))
            series.append(Series(line, metric, _stats(by_x), _base(members[0])))
    if not series:
        return None
    series.sort(key=lambda s: s.line)
    axes = sorted({r["_axis"] for r in used})
    swept = {n for r in used for n in (r.get("sweep") or {})}
    return FigureData(spec, ", ".join(axes), tuple(series), used, tuple(sorted(zipped & swept - set(axes))))


def caption(data: FigureData) -> str:
    """What the figure shows and rests on: rows, points, repeats, and what QPS or an upload rests on."""
    spec, rows = data.spec, data.rows
    points = {point_name(r) for r in rows}
    repeats = [p.repeats for s in data.series for p in s.points]
    text = (
        f"{spec.title}. x: {data.axis}"
        + (f" (swept together with {', '.join(data.zipped)})" if data.zipped else "")
        + f". Each marker is the median over repeats of {len(rows)} {spec.stage} rows "
        f"({len(points)} points, {span(repeats)} {'repeats' if max(repeats) > 1 else 'repeat'} each); "
        "error bars span min–max."
    )
    if spec.stage == "query":
        sent = [r["queries_sent"] for r in rows if r.get("queries_sent") is not None]
        window = [r["window_s"] for r in rows if r.get("window_s") is not None]
        if sent and window:
            text += (
                f" Each QPS rests on {span(sent)} queries sent in {span(window, '{:,.1f}')} s "
                f"(one measured window per repeat)."
            )
        text += (
            f" One query setting per line (in its legend): the highest QPS reaching recall ≥ {MIN_RECALL} "
            "at every point of the line, else the setting with the highest lowest recall; a one-point "
            "line (an unbound point beside its entry's core counts) takes its entry's setting."
        )
    elif spec.stage == "insert":
        vectors = [r["vectors"] for r in rows if r.get("vectors")]
        upload = [r["upload_s"] for r in rows if r.get("upload_s")]
        if vectors and upload:
            text += (
                f" Each throughput is one upload of {span(vectors)} vectors in {span(upload, '{:,.1f}')} s."
            )
    elif spec.stage == "index" and (on_upload := _indexes_on_upload(rows)):
        text += (
            f" {' and '.join(on_upload)} {'builds' if len(on_upload) == 1 else 'build'} the index as vectors "
            "arrive: the time drawn is the wait "
            "for what was still queued after the upload, not a build."
        )
    if spec.name == "study_segments":
        text += " Labels: segments counted after indexing (median over repeats)."
    return text


def _indexes_on_upload(rows: Iterable[Row]) -> list[str]:
    """The databases among ``rows`` that index as vectors arrive (their declaration says so)."""
    names = {r["database"] for r in rows} & set(DATABASES)
    return sorted(name for name in names if database(name).indexes_on_upload)


def _segments(rows: Iterable[Row]) -> dict[str, float]:
    by_label: dict[str, list[float]] = {}
    for r in rows:
        if r.get("stage") == "index" and r.get("status") == "ok" and r.get("segments") is not None:
            by_label.setdefault(point_name(r), []).append(r["segments"])
    return {label: spread(v).median for label, v in by_label.items()}  # type: ignore[union-attr]


def draw(data: FigureData, path: Path, segments: dict[str, float] | None = None) -> Path:
    """One PNG: a panel per metric, a line per series with min–max error bars."""
    figure = new_figure(6.0 * len(data.spec.panels), 4.6)
    bases = sorted({s.entry for s in data.series})
    colors = colors_for(bases)
    styles = ["-", "--", ":", "-."]
    xs = sorted({p.x for s in data.series for p in s.points})
    log = xs[0] > 0 and xs[-1] / xs[0] >= 4
    count = max(len(data.of(m)) for m, _ in data.spec.panels)
    gap = min((b - a for a, b in itertools.pairwise(xs)), default=1.0)

    def dodge(x: float, j: int) -> float:  # lines side by side so their error bars stay apart
        offset = (j - (count - 1) / 2) * 0.25 / max(count, 1)
        return x * 2 ** (offset * 0.5) if log else x + offset * gap

    for i, (metric, ylabel) in enumerate(data.spec.panels):
        axes = figure.add_subplot(1, len(data.spec.panels), i + 1)
        for j, series in enumerate(data.of(metric)):
            x = [dodge(p.x, j) for p in series.points]
            y = [p.median for p in series.points]
            err = [[p.median - p.low for p in series.points], [p.high - p.median for p in series.points]]
            axes.errorbar(
                x,
                y,
                yerr=err,
                fmt=styles[j % len(styles)],
                marker="o",
                ms=4,
                capsize=3,
                color=colors[series.entry],
                label=series.line,
            )
        if segments and i == 0:
            for r in {(r["_x"], point_name(r)): r for r in data.rows}.values():
                counted = segments.get(point_name(r))
                if counted is not None:
                    axes.annotate(
                        f"{counted:g} seg.",
                        (r["_x"], 0),
                        xycoords=("data", "axes fraction"),
                        xytext=(0, 4),
                        textcoords="offset points",
                        ha="center",
                        fontsize=7,
                    )
        if log:
            axes.set_xscale("log", base=2)
        axes.set_xticks(xs, [f"{x:g}" for x in xs])
        axes.set_xlabel(
            "insert clients (workers × clients per worker)" if data.axis == "clients" else data.axis
        )
        axes.set_ylabel(ylabel)
        if metric != "recall" and all(p.low >= 0 for s in data.of(metric) for p in s.points):
            # a scaling curve read from zero: a 3% step is not drawn as a cliff (recall keeps its zoom:
            # 0.95 against 0.99 is the difference that matters there)
            axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, loc="best")
    figure.suptitle(data.spec.title + " (median, min–max over repeats)", fontsize=10)
    return save_figure(figure, path)


def study_section(rows: Sequence[Row], out: Path) -> tuple[list[str], dict[str, Path]]:
    """The report's "Study figures" section and its PNGs: each figure the sweep can draw, the rest listed."""
    lines = [
        "## Study figures",
        "",
        "Shaped like the figures of the study (Ockerman et al., *When More Cores Hurts*, arXiv:2606.08950, "
        "§V), from every repeat of every sweep point: medians with min–max "
        "error bars. A figure is drawn when the sweep varies its axis.",
        "",
    ]
    drawn: dict[str, Path] = {}
    skipped: list[str] = []
    segments = _segments(rows)
    for spec in SPECS:
        data = figure_data(rows, spec)
        if data is None:
            skipped.append(f"- {spec.title} (`{spec.name}`): not drawn, the sweep has no axis: {spec.needs}.")
            continue
        path = draw(data, out / f"{spec.name}.png", segments if spec.name == "study_segments" else None)
        drawn[spec.name] = path
        lines += [f"![{spec.title}]({path.name})", "", f"_{caption(data)}_", ""]
    table = mixed_table(rows)
    if table:
        lines += [
            "### Mixed insert + query: degradation",
            "",
            "Median (min–max) over repeats; the ratio row is mixed ÷ baseline of the medians.",
            "",
            *table,
            "",
        ]
    if not drawn and not table:  # a run without a sweep: one line, not every figure's missing axis
        return [
            "## Study figures",
            "",
            "None: the results vary no axis of the study's figures (a sweep draws them; "
            "docs/vector-databases.md, *Study figures*).",
            "",
        ], drawn
    if skipped:
        lines += ["Not drawn:", "", *skipped, ""]
    return lines, drawn
