"""The pipeline at 10,000, 100,000 and 1,000,000 vectors: seconds, peak memory and disk per stage and
database.

No real dataset of a million 384-dimensional vectors is reachable here, so each size is a SYNTHETIC dataset
drawn with ``python -m pipeline dataset synth`` from a model of the bundled all-MiniLM sample (the dataset
``configs/local.yaml`` makes; made here when the workdir has none), with 1,000 queries and their exact
top-100. Each size then runs as a user runs it: ``python -m pipeline run`` of a config taking that dataset
as ``dataset.stored``, through Qdrant (edge), Milvus, Weaviate and FAISS (HNSW, M 16, ef_construction
128), and ``python -m pipeline report`` rewrites its report alone, so the report's own cost is measured.
Below a million rows every database is measured three times (``vdb.repeats``) and each figure is the median;
every point uploads three times (``insert.batch_sizes`` of one size repeated, each into a fresh collection;
Weaviate, building its graph while it uploads, once) and the insert figures are the median over every
upload of the size (an upload of 100,000 takes 0.4-2 s on Qdrant edge and FAISS: one such figure is noise,
and the million-row size has one point).

Per size it prints, with the load average:
- seconds of the synthetic draw, its exact ground truth, the run, and the report;
- peak RSS of the driver, of the Parsl workers (the clients, and the in-process engines), of the database
  servers (their telemetry), sampled every 0.2 s over the whole process tree;
- per database: upload seconds (first request -> every vector searchable), vectors/s, the acknowledged
  rate (first request -> last acknowledgement) and the drain (last acknowledgement -> searchable: an engine
  indexing from a queue while it uploads, Weaviate, builds its graph there), index seconds, disk bytes,
  recall@10 at ef 64, QPS;
- per database, the resource plan's estimate (``python -m pipeline plan`` of the same config) beside the
  measured memory, disk, upload and index time, with the error (target +-25%);
then the growth exponent of each figure between sizes (the slope of log figure over log N: 1 is linear).

    .venv/bin/python -m benchmarks.scale                          # 10k, 100k, 1M: about an hour on 2 cores
    .venv/bin/python -m benchmarks.scale --sizes 10000 100000     # the two small sizes, a few minutes
    .venv/bin/python -m benchmarks.scale --engines faiss qdrant   # fewer databases
    .venv/bin/python -m benchmarks.scale --matrix                 # every index x quantisation, 20k and 100k

``--matrix`` measures every index type x quantisation each database builds here (its declaration, less
what this machine's servers refuse: Qdrant HNSW with none, scalar, pq, bq and flat; Milvus HNSW, IVF_FLAT,
IVF_SQ8, IVF_PQ, FLAT (the PyPI server has no DiskANN); Weaviate HNSW with four quantisations, flat and
dynamic with none and BQ; FAISS HNSW, IVF-flat, IVF-PQ, flat), labelled ``engine-index-quantisation``, at
20,000 and 100,000 rows by default, one point each; it prints each figure over its engine's HNSW float32
of the same run, and those ratios times the HNSW float32 rows of ``apps.vdb.resources.COSTS``: the rows
the plan ships beyond HNSW.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from benchmarks import common

NAME = "scale"
ENGINES = {
    "qdrant": {"name": "qdrant", "mode": "edge"},
    "milvus": {"name": "milvus", "min_segment_rows_to_index": 0},
    "weaviate": {"name": "weaviate"},
    "faiss": {"name": "faiss"},
}
# The matrix's collection knobs where they differ from the defaults: IVF lists for 100,000 rows, 96 product
# codes (4 dimensions each, as configs/local-engines.yaml), and Weaviate compressing from 10,000 objects
# (its default, 100,000, would leave the smaller size uncompressed).
MATRIX_COLLECTION = {"ivf_nlist": 256, "pq_m": 96, "pq_bits": 8}
MATRIX_OPTIONS = {"weaviate": {"training_limit": 10_000}}
MATRIX_SIZES = [20_000, 100_000]
BATCH_SIZE = 1000
HNSW = ("hnsw", "none")  # the (index, quantisation) every engine's other rows are measured against
# Uploads per point (each into a fresh collection; the index stage builds the last): an upload of 100,000
# rows takes 0.4-2 s on FAISS and Qdrant edge, and a million-row size has one point, so its insert rate
# would otherwise rest on a single upload. An engine that builds its graph while it uploads (Weaviate: 28
# min at 1M) uploads once.
UPLOADS = 3
INSERT_FIELDS = ("upload_s", "insert_vectors_per_s", "drain_s", "acked_vectors_per_s")
RATIO_FIELDS = ("memory_copies", "disk_copies", "fixed_mib", "insert_vectors_per_s", "index_vectors_per_s")
TARGETS = {"exponent": 1.1, "driver_rss_ratio": 1.2, "insert_rate_ratio": 0.8, "plan_error": 0.25}


def _run(args: list[str], cwd: Path, log: Path) -> tuple[float, common.TreeSampler, str]:
    """``python -m pipeline ARGS`` with its process tree sampled; (seconds, sampler, output)."""
    started = time.time()
    child = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args],
        cwd=cwd,
        env={**os.environ, "COLUMNS": "160"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with common.TreeSampler(own_children=[child.pid], include_root=False, reap=True) as sampler:
        output, _ = child.communicate()
    log.write_text(output)
    if child.returncode != 0:
        raise SystemExit(
            f"python -m pipeline {' '.join(args)} failed (exit {child.returncode}):\n{output[-3000:]}"
        )
    return time.time() - started, sampler, output


def role_peak(sampler: common.TreeSampler, *roles: str) -> float:
    """Peak MiB summed over the processes of ``roles`` (each sample's sum, the largest)."""
    sums = [sum(rss for _, role, rss in rows if role in roles) for _, rows in sampler.timeline]
    return round(common.mib(max(sums, default=0)), 1)


def like_dataset(work: Path) -> Path:
    """The all-MiniLM sample dataset: from the repository's workdir (``make run``), else made here."""
    for store in (common.REPO / "store", work / "store"):
        found = sorted((store / "datasets").glob("pes2o-ve-sample-*"))
        found = [f for f in found if "synth" not in f.name and (f / "manifest.json").is_file()]
        if found:
            return found[0]
    config = yaml.safe_load(common.LOCAL_CONFIG.read_text())
    config.pop("vdb")
    config["workdir"] = str(work)
    for section, field in (("corpus", "paths"),):
        config[section][field] = [
            str((common.LOCAL_CONFIG.parent / p).resolve()) for p in config[section][field]
        ]
    config["queries"]["terms_file"] = str(
        (common.LOCAL_CONFIG.parent / config["queries"]["terms_file"]).resolve()
    )
    path = common.write_config(config, work / "local-sample.yaml")
    print(f"making the all-MiniLM sample dataset in {work} (configs/local.yaml without databases)")
    _run(["run", str(path)], common.REPO, work / "local-sample.log")
    return like_dataset(work)


def repeats_for(rows: int, override: int | None) -> int:
    """Points measured per database at one size: ``--repeats`` when given, else 3 below a million rows
    (an upload of 100,000 takes about 2 s on Qdrant edge and FAISS: one such figure is noise) and 1 from a
    million (each upload rests on tens of seconds, each index build on minutes)."""
    return override or (3 if rows < 1_000_000 else 1)


def cost_label(engine: str, index_type: str, quantization: str) -> str:
    """A matrix point's label: ``milvus-ivf_pq-pq``."""
    return f"{engine}-{index_type}-{quantization}"


def matrix_entries(engines: list[str]) -> dict[str, tuple[dict[str, Any], tuple[str, str, str]]]:
    """Every index type x quantisation each engine builds here (its declaration, less what this machine's
    server refuses: the PyPI Milvus has no DiskANN), by label: the database entry and its ``COSTS`` key."""
    from apps.vdb import database
    from apps.vdb.base import CollectionConfig
    from apps.vdb.capabilities import collection_problems

    entries = {}
    for engine in engines:
        declared = database(ENGINES[engine]["name"])
        settings = declared.settings(**ENGINES[engine])
        for index_type in declared.index_types:
            for quantization in declared.builds_with(index_type):
                collection: dict[str, Any] = {"index_type": index_type, "quantization": quantization}
                if quantization != "none" and engine in MATRIX_OPTIONS:
                    collection["options"] = MATRIX_OPTIONS[engine]
                label = cost_label(engine, index_type, quantization)
                spec = CollectionConfig(**{**MATRIX_COLLECTION, **collection})
                refused = collection_problems(settings, 0, spec, None)
                if refused:
                    print(f"not measured here: {label}: {refused[0]}")
                    continue
                entry = {**ENGINES[engine], "label": label, "collection": collection}
                entries[label] = (entry, (engine, index_type, quantization))
    return entries


def builds_while_uploading(engine: str) -> bool:
    """Whether the engine builds its HNSW graph during the upload (Weaviate's async indexing): its
    ``COSTS`` row has no separate index rate."""
    from apps.vdb.resources import COSTS

    cost = COSTS.get((engine, *HNSW))
    return cost is not None and cost.index_vectors_per_s is None


def with_uploads(entry: dict[str, Any], uploads: int) -> dict[str, Any]:
    """A database entry uploading ``uploads`` times per point (once for an engine that builds while it
    uploads): the same batch size repeated in its ``insert.batch_sizes``."""
    if uploads == 1 or builds_while_uploading(entry["name"]):
        return entry
    return {**entry, "insert": {"batch_sizes": [BATCH_SIZE] * uploads}}


def scale_config(
    work: Path,
    dataset: Path,
    rows: int,
    entries: list[dict[str, Any]],
    repeats: int = 1,
    uploads: int = 1,
) -> Path:
    """The run of one size: the synthetic dataset as it is, the database entries (each engine's HNSW, or
    the matrix), one query setting, each point measured ``repeats`` times (each its own deployment) with
    ``uploads`` uploads each (:func:`with_uploads`)."""
    config = {
        "name": f"scale-{rows}",
        "workdir": str(work),
        "dataset": {"name": "scale", "stored": str(dataset)},
        "groundtruth": {"k": 100, "metric": "cosine", "memory_budget_mb": 256},
        "geometry": {"enabled": False},
        "executor": {"platform": "local", "workers": 2},
        "vdb": {
            "databases": [with_uploads(entry, uploads) for entry in entries],
            "collection": {
                "index_type": "hnsw",
                "hnsw_m": 16,
                "ef_construction": 128,
                "deferred_indexing": True,
                **MATRIX_COLLECTION,
            },
            "insert": {
                "batch_sizes": [BATCH_SIZE],
                "workers": 1,
                "clients_per_worker": 2,
                "timeout_s": 14400,
            },
            "query": {
                "ef": [64],
                "batch_size": [32],
                "clients": [1],
                "k": [10],
                "max_queries": 1000,
                "duration_s": 5,
            },
            "index_timeout_s": 14400,
            "repeats": repeats,
        },
    }
    return common.write_config(config, work / f"scale-{rows}.yaml")


ENGINE_ROLES = ("server", "engine", "child")  # telemetry roles holding the index: servers, in-process hosts


def server_peak_mib(point_dir: Path) -> float | None:
    """Peak summed RSS of the processes holding a point's index (its telemetry: the servers, or the
    workers an in-process engine runs in, with their children), MiB; None without any."""
    path = point_dir / "telemetry.parquet"
    if not path.is_file():
        return None
    rows = pq.read_table(path, columns=["time", "role", "rss_bytes"]).to_pylist()
    sums: dict[float, int] = {}
    for r in rows:
        if r["role"] in ENGINE_ROLES and r["rss_bytes"]:
            sums[r["time"]] = sums.get(r["time"], 0) + r["rss_bytes"]
    return round(common.mib(max(sums.values())), 1) if sums else None


def measure(rows: int, args: argparse.Namespace, like: Path, work: Path, runs: Path) -> dict[str, Any]:
    """Draw (or reuse the draw of an earlier invocation), run and report one size; its figures.

    The synthetic datasets are kept in ``work/store`` (drawing is not what is measured twice: its seconds
    come from its manifest); every invocation runs in a fresh ``runs`` workdir, so nothing is reused."""
    print(f"\n=== N = {rows:,} ===  (load average {os.getloadavg()[0]:.2f})")
    _run(
        ["dataset", "synth", "--like", str(like), "--rows", str(rows), "--queries", str(args.queries),
         "--name", f"scale-{rows}-q{args.queries}", "--workdir", str(work)],
        common.REPO,
        runs / f"synth-{rows}.log",
    )  # fmt: skip
    (folder,) = [
        f for f in (work / "store" / "datasets").glob(f"scale-{rows}-q{args.queries}-*") if f.is_dir()
    ]
    manifest = json.loads((folder / "manifest.json").read_text())
    repeats = repeats_for(rows, args.repeats)
    config = scale_config(runs, folder, rows, args.databases, repeats, args.uploads)
    # A fresh draw leaves 1.5 GB a million rows dirty in the page cache, and the previous size's run its
    # collections: the kernel writes them back 30 s later, in the middle of this run's upload unless
    # flushed now.
    os.sync()
    run_seconds, run_sampler, _ = _run(["run", str(config)], common.REPO, runs / f"run-{rows}.log")
    run_dir = sorted((runs / "runs").glob(f"scale-{rows}-*"))[-1]
    report_seconds, report_sampler, _ = _run(
        ["report", str(run_dir)], common.REPO, runs / f"report-{rows}.log"
    )
    provenance = json.loads((run_dir / "provenance.json").read_text())
    vdb_dir = Path(provenance["outputs"]["vdb"])
    results = pq.read_table(vdb_dir / "report" / "results.parquet").to_pylist()
    directories = {(p["label"], p["repeat"]): p["directory"] for p in provenance["stages"]["vdb"]["points"]}
    measured: dict[str, dict[int, dict[str, Any]]] = {}
    for r in results:
        entry = measured.setdefault(r["label"], {}).setdefault(r["repeat"], {})
        if r["stage"] == "insert":
            entry.setdefault("uploads", []).append(upload_figures(r))
        elif r["stage"] == "index":
            entry.update(index_s=r["index_s"], disk_bytes=r["disk_bytes"])
        elif r["stage"] == "query":
            entry.update(recall=r["recall"], qps=r["qps"])
    for (label, repeat), directory in directories.items():
        measured.setdefault(label, {}).setdefault(repeat, {})["server_peak_mib"] = server_peak_mib(
            Path(directory)
        )
    engines = {label: median_figures(list(by_repeat.values())) for label, by_repeat in measured.items()}
    for label, planned in planned_figures(config).items():
        engines.setdefault(label, {})["plan"] = planned
    for entry in engines.values():
        entry["plan_error"] = plan_errors(entry)
    return {
        "rows": rows,
        "repeats": repeats,
        "dimension": manifest["dimension"],
        "synthetic": manifest["synthetic"]["lid"],
        "seconds": {
            "synth": manifest["seconds"],
            "groundtruth": manifest["groundtruth_seconds"],
            "run": round(run_seconds, 2),
            "report": round(report_seconds, 2),
        },
        "peak_mib": {
            "synth": manifest["peak_rss_mib"],  # the drawing process's own peak, from its manifest
            "driver": role_peak(run_sampler, "driver"),
            "workers": role_peak(run_sampler, "parsl worker"),
            "report": round(common.mib(report_sampler.peak), 1),
        },
        "engines": engines,
        "load_average": os.getloadavg(),
    }


def upload_figures(row: dict[str, Any]) -> dict[str, float | None]:
    """One upload's figures from its ``insert`` row of results.parquet: seconds and vectors/s to
    searchable, the drain (last acknowledgement -> searchable: an engine indexing from a queue, Weaviate,
    builds here) and the acknowledged rate (first request -> last acknowledgement)."""
    sending = (row["upload_s"] or 0) - (row["searchable_s"] or 0)
    return {
        "upload_s": row["upload_s"],
        "insert_vectors_per_s": row["insert_vectors_per_s"],
        "drain_s": row["searchable_s"],
        "acked_vectors_per_s": round(row["vectors"] / sending, 1) if sending > 0 else None,
    }


def median_figures(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """One database's figures at one size: the median of each over its repeats (missing ones left out),
    the insert figures over every upload of every repeat (``uploads``); every repeat's own figures are
    kept under ``repeats``."""
    uploads = [u for r in repeats for u in r.get("uploads", [])]
    per_repeat = [{k: v for k, v in r.items() if k != "uploads"} for r in repeats]
    fields = sorted({k for r in per_repeat + uploads for k in r})
    figures: dict[str, Any] = {}
    for field in fields:
        pool = uploads if field in INSERT_FIELDS and uploads else per_repeat
        values = [r[field] for r in pool if r.get(field) is not None]
        figures[field] = statistics.median(values) if values else None
    return {**figures, "uploads": len(uploads), "repeats": repeats}


def planned_figures(config: Path) -> dict[str, dict[str, float | None]]:
    """Each point's resource-plan estimate, as ``python -m pipeline plan`` makes it for this config: the
    memory of the processes holding its index (MiB), its disk (bytes), upload and index seconds."""
    from pipeline.config.loader import load_config
    from pipeline.plan import build_plan

    plan = build_plan(load_config(config))
    return {
        point.label: {
            "server_peak_mib": round(common.mib(found.rank_memory), 1),
            "disk_bytes": round(found.node_disk),
            "upload_s": round(found.upload_s, 3),
            "index_s": round(found.index_s, 3) if found.index_s is not None else None,
        }
        for point, found in plan.resources.estimates
        if found is not None
    }


def plan_errors(entry: dict[str, Any]) -> dict[str, float | None]:
    """The plan's relative error per figure: estimate / measured - 1 (None where either is missing)."""
    planned = entry.get("plan", {})
    errors: dict[str, float | None] = {}
    for field in ("server_peak_mib", "disk_bytes", "upload_s", "index_s"):
        estimate, measured = planned.get(field), entry.get(field)
        errors[field] = round(estimate / measured - 1, 2) if estimate and measured else None
    return errors


def exponent(small: float | None, large: float | None, n_small: int, n_large: int) -> float | None:
    """The log-log slope between two sizes; None when a figure is missing or not positive."""
    if not small or not large or small <= 0 or large <= 0:
        return None
    return round(math.log(large / small) / math.log(n_large / n_small), 2)


def show(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    """Print each size's figures and the growth exponents between consecutive sizes; return the latter."""
    for s in sizes:
        print(
            f"\nN = {s['rows']:,}, median of {s.get('repeats', 1)} per database (LID synthetic "
            f"{s['synthetic']['synthetic']}, real {s['synthetic']['real']}; load {s['load_average'][0]:.2f})"
        )
        print("  seconds: " + ", ".join(f"{k} {v:,.1f}" for k, v in s["seconds"].items()))
        print("  peak RSS MiB: " + ", ".join(f"{k} {v:,.0f}" for k, v in s["peak_mib"].items()))
        width = max(map(len, s["engines"]), default=9)
        for label, e in sorted(s["engines"].items()):
            n = {k: v or 0 for k, v in e.items()}
            print(
                f"  {label:<{width}} upload {n.get('upload_s', 0):8.1f} s ({n.get('uploads', 0)}x)  "
                f"{n.get('insert_vectors_per_s', 0):10,.0f} vec/s (acknowledged "
                f"{n.get('acked_vectors_per_s', 0):,.0f}, then {n.get('drain_s', 0):,.1f} s to searchable)  "
                f"index {n.get('index_s', 0):8.1f} s  "
                f"disk {common.mib(n.get('disk_bytes', 0)):9,.1f} MiB  "
                f"server {n.get('server_peak_mib', 0):8,.0f} MiB  "
                f"recall {n.get('recall', 0):.3f}  QPS {n.get('qps', 0):9,.0f}"
            )
            cells = [f"{k} {'-' if v is None else f'{v:+.0%}'}" for k, v in e.get("plan_error", {}).items()]
            print(
                f"  {'':<{width}} plan vs measured (target +-{TARGETS['plan_error']:.0%}): {', '.join(cells)}"
            )
    growth: dict[str, Any] = {}
    for a, b in itertools.pairwise(sizes):
        key = f"{a['rows']}->{b['rows']}"
        g = {
            f"seconds.{k}": exponent(a["seconds"][k], b["seconds"][k], a["rows"], b["rows"])
            for k in a["seconds"]
        }
        g.update(
            {
                f"peak.{k}": exponent(a["peak_mib"][k], b["peak_mib"][k], a["rows"], b["rows"])
                for k in a["peak_mib"]
            }
        )
        for label in a["engines"]:
            ea, eb = a["engines"][label], b["engines"].get(label, {})
            for field in ("upload_s", "drain_s", "index_s", "disk_bytes", "server_peak_mib"):
                g[f"{label}.{field}"] = exponent(ea.get(field), eb.get(field), a["rows"], b["rows"])
            for rate in ("insert", "acked"):
                rate_a, rate_b = ea.get(f"{rate}_vectors_per_s"), eb.get(f"{rate}_vectors_per_s")
                g[f"{label}.{rate}_rate_ratio"] = round(rate_b / rate_a, 2) if rate_a and rate_b else None
        g["driver_rss_ratio"] = round(b["peak_mib"]["driver"] / a["peak_mib"]["driver"], 2)
        growth[key] = g
        print(
            f"\ngrowth exponents {key} (1 = linear; target <= {TARGETS['exponent']} for ground truth, "
            f"insert, query, report):"
        )
        for name, value in g.items():
            print(f"  {name:<32} {value}")
    return growth


def cost_key(label: str, matrix: dict[str, tuple[str, str, str]]) -> tuple[str, str, str]:
    """The ``COSTS`` key a label measured: the matrix's, else the engine's HNSW float32."""
    return matrix.get(label, (label, *HNSW))


def cost_table(
    sizes: list[dict[str, Any]], matrix: dict[str, tuple[str, str, str]] | None = None
) -> dict[tuple[str, str, str], dict[str, float | None]]:
    """``apps.vdb.resources.COSTS`` from the two largest sizes, by key (engine, index type, quantisation):
    the slope of memory and disk over rows, less the links of its index type (M 16), in float32 vectors;
    the fixed memory at the smaller size; the rates of the larger."""
    from apps.vdb import database, runs_in_process
    from apps.vdb.resources import MEASURED_DIM, link_bytes

    small, large = sizes[-2], sizes[-1]
    vector = 4 * MEASURED_DIM
    table = {}
    for label, big in large["engines"].items():
        little = small["engines"].get(label, {})
        rows = large["rows"] - small["rows"]
        if not (
            big.get("server_peak_mib") and little.get("server_peak_mib") and big.get("index_s") is not None
        ):
            continue
        key = cost_key(label, matrix or {})
        links = link_bytes(key[1], 16)
        memory_slope = (big["server_peak_mib"] - little["server_peak_mib"]) * 2**20 / rows
        disk_slope = ((big.get("disk_bytes") or 0) - (little.get("disk_bytes") or 0)) / rows
        in_process = runs_in_process(database(key[0]).settings(**ENGINES[key[0]]))
        table[key] = {
            "memory_copies": round(max(memory_slope - links, 0) / vector, 2),
            "disk_copies": round(max(disk_slope - links, 0) / vector, 2),
            "fixed_mib": round(max(little["server_peak_mib"] - small["rows"] * memory_slope / 2**20, 0), 0),
            "insert_vectors_per_s": round(big["insert_vectors_per_s"], 0),
            # an engine that builds its index during the upload (Weaviate) reports no separate build
            "index_vectors_per_s": round(large["rows"] / big["index_s"], 0) if big["index_s"] >= 1 else None,
            "measured_processes": 2 if in_process else 1,  # in process: inside both client processes
        }
    return table


def against_peer(
    costs: dict[tuple[str, str, str], dict[str, float | None]],
) -> dict[tuple[str, str, str], dict[str, float | None]]:
    """Each matrix row's figures over its engine's HNSW float32 row of the same run (1: the same; None:
    a figure either lacks, as an index built during the upload)."""
    ratios = {}
    for key, row in costs.items():
        peer = costs.get((key[0], *HNSW))
        if peer is None or key[1:] == HNSW:
            continue
        ratios[key] = {
            field: round(row[field] / peer[field], 2) if row.get(field) and peer.get(field) else None
            for field in RATIO_FIELDS
        }
    return ratios


def anchored_rows(
    ratios: dict[tuple[str, str, str], dict[str, float | None]], shipped: dict[tuple[str, str, str], Any]
) -> dict[tuple[str, str, str], dict[str, float | None]]:
    """The matrix's rows for ``COSTS``: each figure of the engine's shipped HNSW float32 row (measured at
    1M) times its ratio measured here, so that every row of an engine rests on one anchor and the run's own
    drift (a machine state, an in-process engine's varying peak) cancels out."""
    rows = {}
    for key, ratio in ratios.items():
        anchor = shipped.get((key[0], *HNSW))
        if anchor is None:
            continue
        row: dict[str, float | None] = {}
        for field in RATIO_FIELDS:
            base, factor = getattr(anchor, field), ratio[field]
            row[field] = None if base is None or factor is None else round(base * factor, 2)
        for field in ("fixed_mib", "insert_vectors_per_s", "index_vectors_per_s"):
            row[field] = None if row[field] is None else round(row[field])
        row["measured_processes"] = anchor.measured_processes
        rows[key] = row
    return rows


def cost_row(key: tuple[str, str, str], figures: dict[str, float | None]) -> str:
    """One ``COSTS`` entry as it is pasted into apps/vdb/resources.py."""
    return f"    {key!r}: EngineCost({', '.join(f'{k}={v}' for k, v in figures.items())}),"


def insert_summary(growth: dict[str, float | None]) -> list[dict[str, Any]]:
    """The insert-rate target per database between the two largest sizes (``python -m benchmarks``
    headlines the worst). An engine that builds its HNSW graph while it uploads (Weaviate's async indexing:
    ``index_vectors_per_s`` None in ``COSTS``) is judged on its acknowledged rate, as the others, whose
    build is the separate index stage: its build is the drain to searchable, reported with its exponent."""
    summary = []
    for name, ratio in growth.items():
        if not name.endswith(".insert_rate_ratio"):
            continue
        label = name.split(".")[0]
        rate = "acknowledged" if builds_while_uploading(label) else "to searchable"
        if rate == "acknowledged":
            ratio = growth.get(f"{label}.acked_rate_ratio")
        if ratio is not None:
            met = ratio >= TARGETS["insert_rate_ratio"]
            summary.append({"database": label, "ratio": ratio, "rate": rate, "met": met})
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", help="rows (default 10k 100k 1M; --matrix: 20k 100k)")
    parser.add_argument("--engines", nargs="+", choices=sorted(ENGINES), default=list(ENGINES))
    parser.add_argument(
        "--matrix", action="store_true", help="every index type x quantisation the databases build"
    )
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument(
        "--repeats",
        type=int,
        help="points per database at every size (default 3 below 1M rows, 1 from 1M; --matrix: 1)",
    )
    parser.add_argument(
        "--uploads",
        type=int,
        help=f"uploads per point, median over all (default {UPLOADS}; Weaviate, building its graph while it "
        "uploads, once; --matrix: 1)",
    )
    parser.add_argument("--workdir", type=Path, default=common.OUT / "work" / "scale")
    args = parser.parse_args()
    args.sizes = args.sizes or (MATRIX_SIZES if args.matrix else [10_000, 100_000, 1_000_000])
    if args.matrix and args.repeats is None:
        args.repeats = 1  # two dozen points: their slopes rest on the two sizes, not on repeats
    if args.uploads is not None and args.uploads < 1:
        parser.error(f"--uploads must be at least 1, not {args.uploads}")
    args.uploads = args.uploads or (1 if args.matrix else UPLOADS)
    points = matrix_entries(args.engines) if args.matrix else {}
    matrix = {label: key for label, (_, key) in points.items()}
    args.databases = (
        [entry for entry, _ in points.values()] if args.matrix else [ENGINES[e] for e in args.engines]
    )
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    common.become_subreaper()
    like = like_dataset(work)
    print(f"model fitted to {like} ({common.cores()} cores, load average {os.getloadavg()[0]:.2f})")
    runs = work / time.strftime("runs-%Y%m%dT%H%M%S")
    runs.mkdir()
    sizes = [measure(rows, args, like, work, runs) for rows in sorted(args.sizes)]
    growth = show(sizes)
    costs = cost_table(sizes, matrix) if len(sizes) > 1 else {}
    print("\nrows for apps/vdb/resources.COSTS (the two largest sizes):")
    for key, figures in costs.items():
        print(cost_row(key, figures))
    ratios = against_peer(costs)
    anchored: dict[tuple[str, str, str], dict[str, float | None]] = {}
    if ratios:
        from apps.vdb.resources import COSTS

        print("\neach over its engine's HNSW float32 of this run:")
        for key, r in ratios.items():
            cells = "  ".join(f"{k.split('_')[0]} {'-' if v is None else v}" for k, v in r.items())
            print(f"  {'-'.join(key):<28} {cells}")
        anchored = anchored_rows(ratios, COSTS)
        print(
            "\nthose ratios times each engine's HNSW float32 row of COSTS (measured at 1M): the rows it ships"
        )
        for key, figures in anchored.items():
            print(cost_row(key, figures))
    summary = insert_summary(list(growth.values())[-1] if growth and not matrix else {})
    for row in summary:
        print(
            f"insert rate {row['database']}: {row['ratio']} x the smaller size's ({row['rate']}; target >= "
            f"{TARGETS['insert_rate_ratio']}): {'MET' if row['met'] else 'NOT MET'}"
        )
    path = common.write_json(
        NAME + ("-matrix" if matrix else ""),
        {
            "like": str(like),
            "sizes": sizes,
            "growth": growth,
            "costs": {"-".join(key): figures for key, figures in costs.items()},
            "against_hnsw_float32": {"-".join(key): r for key, r in ratios.items()},
            "anchored_rows": {"-".join(key): r for key, r in anchored.items()},
            "targets": TARGETS,
            "summary": summary,
        },
    )
    print(f"\nraw figures: {path}")


if __name__ == "__main__":
    main()
