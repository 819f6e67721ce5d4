"""Import an ANN dataset (see :mod:`apps.interchange.formats`) into the project's dataset layout, and check
its published ground truth against the project's exact search.

The result, ``<store>/datasets/<name>-<key>/``, is what the embed, queries and ground-truth stages make:
``part-NNNNN.parquet`` (id, doc_id, chunk_index, embedding), ``README.md`` (the card), ``queries.parquet``
(id, text, embedding), ``groundtruth.parquet`` (query_id, neighbors, distances: the *published* neighbours,
their distances recomputed by the project's definitions) and, last, ``manifest.json``. Everything is written
into a temporary folder beside it and renamed into place, so a folder under that name is always complete.

The check: :func:`apps.dataset.groundtruth.stage.exact_topk` over the written parts, with the file's metric. A
query agrees when, position by position, its published neighbour is as far from it as the exact one (float64,
within :func:`apps.dataset.groundtruth.exact_distance.tie_tolerance`, the recall's own): the lists may differ
only among neighbours at equal distance.
"""

from __future__ import annotations

import errno
import logging
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from apps.dataset.groundtruth.exact_distance import (
    METRICS,
    TIE_ATOL,
    TIE_RTOL,
    exact_distances,
    tie_tolerance,
)
from apps.dataset.groundtruth.stage import exact_topk, groundtruth_table
from apps.dataset.layout import dataset_problems, iter_vectors, own_files, vectors_to_arrow, write_part
from apps.dataset.lookup import fetch_vectors
from apps.interchange.cards import card_problem, card_rows_note
from apps.interchange.formats import Source, canonical_format, first_bad_row, open_source
from core.errors import ArtifactError, InputDataError
from core.format import table
from core.store import (
    MANIFEST,
    atomic_write_json,
    atomic_write_text,
    content_key,
    exclusive_lock,
    read_manifest,
    sha256_file,
    staged_directory,
    write_parquet_atomic,
)

# 2: the ground-truth check and stored distances by the exact float64 arithmetic; 3: its ties are the
# recall's (an absolute floor of 1e-6, not 1e-11): a check's outcome can differ, so its key does
STAGE_VERSION = "3"
SHOWN = 5  # disagreeing queries named in the warning and the manifest
STALE_SECONDS = 3600.0  # without a lock, a temporary folder untouched this long is a killed import's
log = logging.getLogger(__name__)


@dataclass
class Imported:
    """What :func:`import_dataset` made: the folder, its manifest, and whether it was already there."""

    directory: Path
    manifest: dict[str, Any]
    cached: bool = False

    @property
    def check(self) -> dict[str, Any]:
        """The ground-truth check recorded in the manifest."""
        return self.manifest["import"]["groundtruth_check"]


def file_identity(path: Path) -> dict[str, Any]:
    """A source file's identity: name, size and the sha256 of all of it (an edit anywhere is a new
    dataset; one sequential read, cheaper than the exact search the import runs over the same bytes)."""
    return {"name": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def _metric(source: Source, requested: str | None, asked_by: str = "--metric") -> str:
    if requested and source.metric and requested != source.metric:
        raise InputDataError(
            f"{source.files['base']}: the file declares metric {source.metric}, "
            f"{asked_by} asks for {requested}"
        )
    return requested or source.metric or "l2"


def _zero_rows(vectors: np.ndarray) -> np.ndarray:
    """Rows of ``vectors`` whose every value is 0."""
    return np.flatnonzero(~np.any(vectors, axis=1))


def _zero_line(role: str, count: int, first: int, where: str) -> str | None:
    """A cosine dataset's warning for its ``count`` vectors of norm 0 (the first at row ``first``), None
    when there are none: their distance is undefined, so the engines and the exact search each give it
    their own value."""
    if not count:
        return None
    return (
        f"{count:,} {role} vector(s) of norm 0 under metric cosine (first: {where} row {first}, "
        "0-based): their distance is undefined, so engines and the exact search may rank them differently"
    )


def _write_parts(
    source: Source, out: Path, rows_per_part: int, row_group_rows: int, meta: dict
) -> tuple[list[dict], str | None]:
    """Stream the base into ``part-NNNNN.parquet`` files; return their records and, for a cosine dataset,
    a warning when some vectors have norm 0."""
    records = []
    seen: list[np.ndarray] = []
    offset = 0
    zeros, first_zero = 0, 0  # a cosine dataset's base rows of norm 0: how many, the first
    for shard, (ids, vectors) in enumerate(source.batches(rows_per_part)):
        first_bad_row(vectors, source.files["base"], "base", offset)
        if meta["metric"] == "cosine" and (found := _zero_rows(vectors)).size:
            first_zero = first_zero if zeros else offset + int(found[0])
            zeros += int(found.size)
        offset += len(vectors)
        records.append(write_part(out, shard, ids, vectors, meta, row_group_rows=row_group_rows))
        if not source.ids_are_rows:
            seen.append(ids)
    if not source.ids_are_rows:  # vdbbench: ids are the id column's, unique and covering the neighbours
        all_ids = np.sort(np.concatenate(seen))
        if (repeated := np.flatnonzero(np.diff(all_ids) == 0)).size:
            raise InputDataError(
                f"{source.files['base']}: the id column repeats ids ({repeated.size:,} repeats; the first: "
                f"id {int(all_ids[repeated[0]])})"
            )
        pos = np.searchsorted(all_ids, source.gt_ids).clip(max=len(all_ids) - 1)
        bad = np.flatnonzero(all_ids[pos] != source.gt_ids)
        if bad.size:
            q, col = divmod(int(bad[0]), source.gt_ids.shape[1])
            raise InputDataError(
                f"{source.files['groundtruth']}: {bad.size} neighbour id(s) not in {source.files['base']}; "
                f"first: query {int(source.query_ids[q])}, position {col}: {int(source.gt_ids[q, col])}"
            )
    return records, _zero_line("base", zeros, first_zero, source.where("base"))


def compare_groundtruth(
    dataset_dir: Path,
    query_ids: np.ndarray,
    queries: np.ndarray,
    published: np.ndarray,
    metric: str,
    memory_budget_mb: int = 512,
) -> tuple[dict[str, Any], np.ndarray]:
    """Check ``published`` (Q, k) ids against the exact search over ``dataset_dir``.

    Returns (the check record, float32 distances of the published neighbours). Only queries whose lists
    differ from the exact ones get their vectors fetched (one pass over the parts) and float64 distances.
    """
    k = published.shape[1]
    started = time.time()
    stats: dict[str, Any] = {}
    exact_ids, exact_dist = exact_topk(
        queries, iter_vectors(dataset_dir), k, metric, "cpu", memory_budget_mb, stats=stats
    )
    differ = np.flatnonzero((exact_ids != published).any(axis=1))
    out_distances = exact_dist.astype(np.float32)
    bad_rows: list[int] = []
    shown: list[dict[str, Any]] = []
    if differ.size:
        lookup = fetch_vectors(dataset_dir, np.concatenate([published[differ], exact_ids[differ]]))
        for start in range(0, differ.size, 256):  # bounded memory: (rows, k, dim) float64 per block
            rows = differ[start : start + 256]
            q = queries[rows]
            dp = exact_distances(q, lookup.get(published[rows].ravel()).reshape(len(rows), k, -1), metric)
            de = exact_distances(q, lookup.get(exact_ids[rows].ravel()).reshape(len(rows), k, -1), metric)
            de = np.sort(de, axis=1)
            out_distances[rows] = dp
            gap = np.abs(dp - de) > tie_tolerance(np.maximum(np.abs(dp), np.abs(de)))
            for i in np.flatnonzero(gap.any(axis=1)):
                bad_rows.append(int(rows[i]))
                if len(shown) < SHOWN:
                    pos = int(np.flatnonzero(gap[i])[0])
                    shown.append(
                        {
                            "query_id": int(query_ids[rows[i]]),
                            "position": pos,
                            "published_id": int(published[rows[i], pos]),
                            "published_distance": float(dp[i, pos]),
                            "exact_id": int(exact_ids[rows[i], pos]),
                            "exact_distance": float(de[i, pos]),
                        }
                    )
    check = {
        "metric": metric,
        "k": k,
        "queries": len(queries),
        "identical": int(len(queries) - differ.size),
        "agree_up_to_ties": int(len(queries) - len(bad_rows)),
        "disagree": len(bad_rows),
        "disagreeing_query_ids": [int(query_ids[r]) for r in bad_rows[:1000]],
        "first": shown,
        "tie_rtol": TIE_RTOL,
        "tie_atol": TIE_ATOL,
        "engine": stats.get("engine"),
        "seconds": round(time.time() - started, 3),
    }
    return check, out_distances


def warning_line(check: dict[str, Any], groundtruth_file: Path | str) -> str | None:
    """One line saying how the published ground truth disagrees with exact search; None when it agrees."""
    if not check["disagree"]:
        return None
    first = "; ".join(
        f"query {s['query_id']} position {s['position']}: published {s['published_id']} at "
        f"{s['published_distance']:.6g}, exact {s['exact_id']} at {s['exact_distance']:.6g}"
        for s in check["first"]
    )
    # Most lists disagreeing is rarely a publisher's error: more often they were made with another metric.
    others = [m for m in METRICS if m != check["metric"]]
    hint = (
        f"; most disagree: was it computed with another metric (--metric {' or '.join(others)})?"
        if check["disagree"] * 2 > check["queries"]
        else ""
    )
    return (
        f"{groundtruth_file}: published ground truth disagrees with exact {check['metric']} search "
        f"beyond ties on {check['disagree']} of {check['queries']} queries (top-{check['k']}); first: {first}"
        + hint
    )


def dataset_card(manifest: dict[str, Any]) -> str:
    """The imported dataset's card (README.md)."""
    imp = manifest["import"]
    check = imp["groundtruth_check"]
    files = "\n".join(f"- {role}: `{f['name']}` ({f['bytes']:,} bytes)" for role, f in imp["files"].items())
    verdict = (
        "agrees with the project's exact search up to ties"
        if not check["disagree"]
        else f"**disagrees** with the project's exact search on {check['disagree']} queries"
    )
    gt_k = manifest["groundtruth"]["k"]
    properties = [
        ("rows (vectors)", f"{manifest['rows']:,}"),
        ("parts", f"{len(manifest['files'])} (`part-NNNNN.parquet`)"),
        ("dimension", manifest["dimension"]),
        ("source element type", f"{imp['source_dtype']} (stored as float32)"),
        ("metric", imp["metric"]),
        ("queries", f"{manifest['queries']['count']:,} (`queries.parquet`)"),
        ("ground truth", f"top-{gt_k} published neighbours (`groundtruth.parquet`), {verdict}"),
        ("content key", f"`{manifest['key']}`"),
    ]
    return f"""# {manifest["metadata"]["dataset_name"]}

Imported from {imp["format"]} files by `python -m pipeline dataset import`.

{chr(10).join(table(["property", "value"], properties, limit=None))}

## Source files
{files}

Ids: {"the source's `id` column" if not imp["ids_are_rows"] else "0-based row numbers of the base file"}.
`doc_id` and `chunk_index` are null (there is no text). Keep the source's attribution and licence.
"""


def cached_import(final: Path) -> dict[str, Any] | None:
    """The manifest of a complete earlier import at ``final``; None when there is none.

    ArtifactError when ``final`` holds a damaged one: its parts (sizes), queries and ground truth (sizes
    and sha256: they are small) must all match the manifest.
    """
    if not final.exists():
        return None
    try:
        manifest = read_manifest(final)
    except ArtifactError:  # damaged: named below with this folder's remedy
        manifest = None
    if not isinstance(manifest, dict):
        problems = [f"{final / MANIFEST}: missing or not readable JSON"]
    else:
        problems = dataset_problems(final, manifest)
        if not own_files(manifest):
            problems.append(f"{final / MANIFEST}: lists no queries or ground truth")
    if problems:
        raise ArtifactError(
            f"{final} holds a damaged or incomplete dataset ({problems[0]}); remove it and import again"
        )
    return manifest


def sweep_stale(final: Path, locked: bool, max_age: float = STALE_SECONDS) -> list[Path]:
    """Remove the temporary folders a killed import of ``final`` left beside it; return them.

    Holding ``final``'s lock (``locked``), every one is stale: only the lock's holder writes one. Without
    a lock (a file system that refuses them) only those untouched for ``max_age`` seconds are.
    """
    pattern = re.compile(rf"\.{re.escape(final.name)}\.[A-Za-z0-9_]+\.tmp")
    swept = []
    for path in final.parent.iterdir():
        if not (pattern.fullmatch(path.name) and path.is_dir()):
            continue
        if locked or time.time() - path.stat().st_mtime > max_age:
            shutil.rmtree(path, ignore_errors=True)
            swept.append(path)
    if swept:
        log.info("removed %d stale temporary folder(s) of %s", len(swept), final)
    return swept


@dataclass
class ImportTarget:
    """Where an import of these files lands, known before any row is read: the opened source, the
    resolved metric, the files' identity and the content key that names the folder."""

    source: Source
    fmt: str
    metric: str
    identity: dict[str, Any]
    key: str
    directory: Path
    rows_note: str | None = None  # card_rows_note: said before the rows are read, kept in the manifest


def import_target(
    fmt: str,
    paths: list[str | Path],
    name: str,
    store: Path,
    metric: str | None = None,
    rows_per_part: int = 1_000_000,
    asked_by: str = "--metric",
) -> ImportTarget:
    """Open ``paths`` in ``fmt`` and name the folder their import makes (``<store>/datasets/<name>-<key>``).

    InputDataError when the files do not match the format or the metric differs from the file's own.
    """
    fmt = canonical_format(fmt)
    source = open_source(fmt, paths)
    if (problem := card_problem(name, source.dim, source.where("base"))) is not None:
        raise InputDataError(problem)
    metric = _metric(source, metric, asked_by)
    identity = {role: file_identity(path) for role, path in source.files.items()}
    params = {"format": fmt, "files": identity, "metric": metric, "rows_per_part": rows_per_part}
    key = content_key("import", STAGE_VERSION, params)
    rows_note = card_rows_note(name, source.rows, source.where("base"))
    return ImportTarget(source, fmt, metric, identity, key, store / "datasets" / f"{name}-{key}", rows_note)


def import_dataset(
    fmt: str,
    paths: list[str | Path],
    name: str,
    store: Path,
    metric: str | None = None,
    rows_per_part: int = 1_000_000,
    row_group_rows: int = 4096,
    memory_budget_mb: int = 512,
) -> Imported:
    """Import ``paths`` in ``fmt`` as dataset ``name`` under ``store``; see the module docstring."""
    target = import_target(fmt, paths, name, store, metric, rows_per_part)
    return run_import(target, name, rows_per_part, row_group_rows, memory_budget_mb)


def import_lock(final: Path) -> Path:
    """The lock file one import of the files that land at ``final`` holds (``store/locks/datasets/``)."""
    return final.parent.parent / "locks" / "datasets" / f"{final.name}.lock"


def run_import(
    target: ImportTarget,
    name: str,
    rows_per_part: int = 1_000_000,
    row_group_rows: int = 4096,
    memory_budget_mb: int = 512,
) -> Imported:
    """Write ``target``'s folder (or find it written); one import of the same files at a time."""
    final = target.directory
    if (done := cached_import(final)) is not None:
        return Imported(final, done, cached=True)
    # One import of these files at a time: a second one waits, then finds the first's dataset.
    with exclusive_lock(import_lock(final)) as locked:
        if (done := cached_import(final)) is not None:
            return Imported(final, done, cached=True)
        final.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(final, locked)
        try:
            with staged_directory(final) as tmp:
                manifest = _build(target, tmp, name, rows_per_part, row_group_rows, memory_budget_mb)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and (done := cached_import(final)) is not None:
                return Imported(final, done, cached=True)  # an unlocked concurrent import finished first
            raise
    return Imported(final, manifest)


def _build(
    target: ImportTarget,
    out: Path,
    name: str,
    rows_per_part: int,
    row_group_rows: int,
    memory_budget_mb: int,
) -> dict[str, Any]:
    """Write ``target``'s parts, queries, ground truth, card and manifest (last) into ``out``."""
    source, fmt, key, metric = target.source, target.fmt, target.key, target.metric
    started = time.time()
    meta = {
        "dataset_name": name,
        "dataset_key": key,
        "dimension": source.dim,
        "output_dtype": "float32",
        "source": f"import:{fmt}",
        "metric": metric,
    }
    parts, zero_base = _write_parts(source, out, rows_per_part, row_group_rows, meta)
    manifest: dict[str, Any] = {
        "stage": "embed",
        "version": STAGE_VERSION,
        "key": key,
        "dimension": source.dim,
        "rows": sum(p["rows"] for p in parts),
        "bytes": sum(p["bytes"] for p in parts),
        "metadata": meta,
        "files": parts,
    }
    atomic_write_json(out / "manifest.json", manifest)  # provisional: the readers need it; rewritten below
    queries = pa.table(
        {
            "id": pa.array(source.query_ids, pa.int64()),
            "text": pa.nulls(len(source.query_ids), pa.string()),
            "embedding": vectors_to_arrow(source.queries, "float32"),
        }
    )
    queries_written = write_parquet_atomic(queries, out / "queries.parquet")
    zero_queries = None
    if metric == "cosine" and (found := _zero_rows(source.queries)).size:
        zero_queries = _zero_line("query", int(found.size), int(found[0]), source.where("queries"))
    k = min(source.gt_ids.shape[1], manifest["rows"])
    published = np.ascontiguousarray(source.gt_ids[:, :k])
    check, gt_distances = compare_groundtruth(
        out, source.query_ids, source.queries, published, metric, memory_budget_mb
    )
    groundtruth = groundtruth_table(source.query_ids, published, gt_distances)
    gt_written = write_parquet_atomic(groundtruth, out / "groundtruth.parquet")
    manifest.update(
        queries={"file": "queries.parquet", "count": len(source.query_ids), **queries_written},
        groundtruth={"file": "groundtruth.parquet", "k": k, "metric": metric, **gt_written},
        metric=metric,
        warnings=[
            w
            for w in (
                warning_line(check, source.files["groundtruth"]),
                zero_base,
                zero_queries,
                target.rows_note,
            )
            if w
        ],
        upstream_keys=[],
    )
    manifest["import"] = {
        "format": fmt,
        "files": target.identity,
        "paths": {role: str(path.resolve()) for role, path in source.files.items()},
        "source_dtype": source.base_dtype,
        "ids_are_rows": source.ids_are_rows,
        "metric": metric,
        "published_k": int(source.gt_ids.shape[1]),
        "published_distances": source.gt_distances is not None,
        "groundtruth_check": check,
        "seconds": round(time.time() - started, 3),
    }
    atomic_write_text(out / "README.md", dataset_card(manifest))
    atomic_write_json(out / "manifest.json", manifest)
    return manifest
