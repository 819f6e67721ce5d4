"""What the database benchmarks share (``ingest``, ``query_harness``, ``peer_vectordbbench``,
``ef_monotonicity``): the dataset they upload, the settings of ``configs/local.yaml``, the CPU meter, the
pipeline's own load of a collection, and the dataset ``configs/local.yaml`` builds.

:func:`local_dataset` plans ``configs/local.yaml`` with the work directory set to the repository (the store a
``make run`` uses, so either reuses the other's stages) and runs whatever dataset stage is not complete yet
with the project's own stage functions, in this process: shard -> chunk -> embed -> queries -> ground truth.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from benchmarks import common

# --- data --------------------------------------------------------------------------------------------------


def project_dataset() -> Path | None:
    """The newest complete dataset of the project's store (``store/datasets/*/manifest.json``)."""
    found = sorted(
        (p.parent for p in (common.REPO / "store" / "datasets").glob("*/manifest.json")),
        key=lambda d: (d / "manifest.json").stat().st_mtime,
    )
    return found[-1] if found else None


def read_dataset(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ids, float32 vectors) of every part, in dataset order."""
    from apps.dataset.layout import arrow_to_vectors, dataset_parts

    ids, vectors = [], []
    for part in dataset_parts(directory):
        table = pq.read_table(part, columns=["id", "embedding"])
        ids.append(table.column("id").to_numpy())
        vectors.append(arrow_to_vectors(table.column("embedding")))
    return np.concatenate(ids), np.concatenate(vectors)


def write_dataset(directory: Path, ids: np.ndarray, vectors: np.ndarray, sizes: list[int], rg: int) -> Path:
    """``ids``/``vectors`` in the project's dataset layout: parts of ``sizes`` rows, row groups ``rg``."""
    from apps.dataset.layout import finalize_dataset, write_part

    directory.mkdir(parents=True, exist_ok=True)
    records, start = [], 0
    for shard, size in enumerate(sizes):
        rows = slice(start, start + size)
        start += size
        records.append(write_part(directory, shard, ids[rows], vectors[rows], None, row_group_rows=rg))
    finalize_dataset(str(directory), directory.name, records, {"dimension": vectors.shape[1]}, {})
    return directory


def random_dataset(rows: int, dim: int = 384) -> dict[str, Any]:
    """``rows`` seeded random unit vectors of ``dim`` (MiniLM's) in the pipeline's dataset layout.

    Parts of 1,024 rows, one row group each (configs/local.yaml's shards of 250 documents give parts of
    about 1,000 chunks), so the insert stage gets as many work units as a real dataset of this size would
    give it, and two clients get equal shares. Random vectors are fine for a
    speed figure (the output says so); cached under ``benchmarks/out/work/``.
    """
    directory = common.OUT / "work" / f"ingest-random-{dim}-{rows}-1024"
    rng = np.random.default_rng(12)
    vectors = rng.standard_normal((rows, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(rows, dtype=np.int64)
    if not (directory / "manifest.json").exists():
        sizes = [min(1024, rows - start) for start in range(0, rows, 1024)]
        write_dataset(directory, ids, vectors, sizes, 1024)
    return {
        "dir": directory,
        "label": f"random unit vectors ({rows} x {dim}, seed 12)",
        "metric": "cosine",
        "ids": ids,
        "vectors": vectors,
    }


def bench_dataset(rows: int | None, default_rows: int) -> dict[str, Any]:
    """The dataset both sides load: the project's (its first ``rows``) when one was built, else
    ``rows or default_rows`` random unit vectors of 384 dims (:func:`random_dataset`)."""
    source = project_dataset()
    if source is None:
        data = random_dataset(rows or default_rows)
    else:
        ids, vectors = read_dataset(source)
        label, directory = f"store/datasets/{source.name}", source
        if rows and rows < len(ids):  # the first rows, with the source's part boundaries
            from core.store import read_manifest

            sizes, left = [], rows
            for entry in read_manifest(source)["files"]:
                sizes.append(min(entry["rows"], left))
                left -= sizes[-1]
                if not left:
                    break
            ids, vectors = ids[:rows], vectors[:rows]
            directory = common.OUT / "work" / f"ingest-{source.name}-{rows}"
            if not (directory / "manifest.json").exists():
                write_dataset(directory, ids, vectors, sizes, 4096)
            label += f" (first {rows} rows)"
        data = {"dir": directory, "label": label, "metric": "cosine", "ids": ids, "vectors": vectors}
    from apps.vdb.stages.insert import work_units

    return {**data, "units": work_units(str(data["dir"]))}


# --- configuration: the settings of configs/local.yaml -----------------------------------------------------


def bench_queries(dim: int) -> Path:
    """The project's query set of the same dimension (store/queries/*/queries.parquet), else 500 seeded
    random unit vectors of ``dim`` (synthetic: only speed is compared, both sides send the same ones)."""
    from apps.dataset.layout import vectors_to_arrow
    from core.store import read_manifest, write_parquet_atomic

    found = sorted(
        (p for p in (common.REPO / "store" / "queries").glob("*/queries.parquet")),
        key=lambda p: p.stat().st_mtime,
    )
    for path in reversed(found):
        if (read_manifest(path.parent) or {}).get("dimension") == dim:
            return path
    path = common.OUT / "work" / f"bench-random-{dim}-queries.parquet"
    if not path.exists():
        vectors = np.random.default_rng(13).standard_normal((500, dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        table = pa.table(
            {
                "id": np.arange(len(vectors), dtype=np.int64),
                "text": [""] * len(vectors),
                "embedding": vectors_to_arrow(vectors, "float32"),
            }
        )
        write_parquet_atomic(table, path)
    return path


def vdb_config() -> Any:
    from pipeline.config.model import VdbConfig

    return VdbConfig.model_validate(yaml.safe_load(common.LOCAL_CONFIG.read_text())["vdb"])


def settings_for(database: str, cfg: Any) -> Any:
    """The adapter settings of ``database`` as configs/local.yaml gives them (qdrant-local: local mode)."""
    from apps.vdb import database as declared

    name = "qdrant" if database == "qdrant-local" else database
    found = next((s for s in cfg.databases if s.name == name), None)
    settings = found or declared(name).settings(name=name)
    if database == "qdrant-local":
        settings = settings.model_copy(update={"mode": "server", "url": None})  # local_path set at start
    return settings


class CpuMeter:
    """CPU seconds since creation: this process with its client processes (live ones, as the insert
    stage keeps its pool between uploads, and reaped ones), and the server's process tree."""

    def __init__(self, server_pids: list[int]) -> None:
        self.server_pids = server_pids
        self.start = self._snapshot()

    @staticmethod
    def _tree(roots: list[Any]) -> dict[int, float]:
        import psutil

        seen: dict[int, float] = {}
        for root in roots:
            with contextlib.suppress(psutil.Error):
                for proc in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        t = proc.cpu_times()
                        seen[proc.pid] = t.user + t.system
        return seen

    def _snapshot(self) -> tuple[float, float, dict[int, float], float]:
        import resource

        import psutil

        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # client processes that exited
        roots = []
        for pid in self.server_pids:
            with contextlib.suppress(psutil.Error):
                roots.append(psutil.Process(pid))
        server = self._tree(roots)
        me = psutil.Process()
        live = {
            pid: cpu for pid, cpu in self._tree(me.children(recursive=False)).items() if pid not in server
        }
        return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime, live, sum(server.values())

    def read(self) -> dict[str, float]:
        end = self._snapshot()
        live = sum(cpu - self.start[2].get(pid, 0.0) for pid, cpu in end[2].items())
        client = end[0] - self.start[0] + end[1] - self.start[1] + live
        return {"client_cpu_s": client, "server_cpu_s": end[3] - self.start[3]}


def collection_spec(cfg: Any, name: str, dim: int, metric: str) -> Any:
    """The collection configs/local.yaml describes (``cfg``: its vdb config), named ``name``, with the
    data's ``dim`` and ``metric``."""
    from apps.vdb.base import CollectionSpec

    return CollectionSpec(name=name, dim=dim, metric=metric, **cfg.collection.model_dump(exclude={"name"}))


def context(
    database: str, settings: Any, endpoints: Any, spec: Any, data: dict[str, Any], **extra: Any
) -> dict:
    """What a benchmark's arms share about one served database (``ctx``): its name, settings, endpoints
    (also as plain data, for a child process), collection and dataset, plus the benchmark's ``extra``."""
    return {
        "database": database,
        "settings": settings,
        "endpoints": endpoints.model_dump(),
        "endpoints_model": endpoints,
        "spec": spec.model_dump(),
        "data": data,
        **extra,
    }


@contextlib.contextmanager
def served(
    database: str, settings: Any, startup_timeout_s: float, keep: bool, cpus: list[int] | None = None
) -> Iterator[tuple[Path, Any]]:
    """(work directory, endpoints) of the database's local servers for one benchmark: started under
    ``<work>/server`` (pinned to ``cpus`` when given), stopped, and the work directory removed unless
    ``keep``, however the block ends."""
    from apps.vdb import database as declared

    prefix = common.OUT / "work"
    prefix.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"bench-{database}-", dir=prefix))
    deployment = declared(database).deployment(settings)
    deployment.cpus = cpus
    try:
        yield work, deployment.start(work / "server", startup_timeout_s)
    finally:
        deployment.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def target_of(ctx: dict[str, Any], settings: Any | None = None) -> Any:
    """The stages' DatabaseTarget for this context (``settings`` overrides the context's)."""
    from apps.vdb.records import DatabaseTarget

    return DatabaseTarget(
        settings=settings or ctx["settings"], endpoints=ctx["endpoints"], collection=ctx["spec"]
    )


# --- the dataset configs/local.yaml builds, and a collection loaded by the pipeline's stages -------------


@dataclass
class LocalDataset:
    """Where the dataset stages of ``configs/local.yaml`` put their outputs."""

    dataset_dir: Path
    queries_file: Path
    groundtruth_file: Path
    metric: str
    key: str  # the ground-truth stage's content key: names the export

    def label(self) -> str:
        return (
            str(self.dataset_dir.relative_to(common.REPO))
            if self.dataset_dir.is_relative_to(common.REPO)
            else str(self.dataset_dir)
        )


def local_plan(workdir: Path = common.REPO) -> Any:
    """The plan of ``configs/local.yaml`` with its store under ``workdir``."""
    from pipeline.config.loader import load_config
    from pipeline.plan import build_plan

    os.environ["PIPELINE_WORKDIR"] = str(workdir)
    return build_plan(load_config(common.LOCAL_CONFIG))


def local_dataset(workdir: Path = common.REPO) -> LocalDataset:
    """Run the dataset stages of ``configs/local.yaml`` that are not complete; return their outputs."""
    from apps.dataset import chunking as chunk_stage
    from apps.dataset import corpus as corpus_stage
    from apps.dataset.embedding import stage as embed_stage
    from apps.dataset.groundtruth.stage import compute_groundtruth
    from apps.dataset.layout import finalize_dataset
    from apps.dataset.queries import build_queries
    from core.store import read_manifest
    from pipeline.dag import finalize_chunks

    plan = local_plan(workdir)
    cfg = plan.config
    if cfg.queries is None:
        raise SystemExit(f"{common.LOCAL_CONFIG}: no queries section; the peer benchmark needs queries")
    shard, chunks, embed = plan.stage("shard"), plan.stage("chunk"), plan.stage("embed")
    queries, gt = plan.stage("queries"), plan.stage("groundtruth")
    if not embed.complete or not chunks.complete:
        docs = corpus_stage.shard_corpus(
            [str(p) for p in plan.corpus_files], cfg.corpus, cfg.sharding, str(shard.directory)
        )
        records = [
            chunk_stage.chunk_shard(
                str(shard.directory / entry["file"]),
                str(chunks.directory),
                index,
                cfg.chunking,
                str(plan.tokenizer_dir),
                plan.embedding,
            )
            for index, entry in enumerate(docs["files"])
        ]
        finalize_chunks(str(chunks.directory), chunks.key, chunks.upstream, *records)
        if not embed.complete:
            parts = [
                embed_stage.embed_shard(
                    str(chunks.directory / r["file"]),
                    r["shard"],
                    str(embed.directory),
                    plan.embedding,
                    plan.file_metadata,
                    cfg.dataset.holdout_fraction,
                    cfg.dataset.row_group_rows,
                )
                for r in records
            ]
            extra = {"chunks_key": chunks.key, "upstream_keys": embed.upstream}
            finalize_dataset(str(embed.directory), embed.key, parts, plan.file_metadata, extra)
    chunk_files = [
        str(chunks.directory / f["file"]) for f in (read_manifest(chunks.directory) or {}).get("files", [])
    ]
    terms = str(plan.terms_file) if plan.terms_file else None
    build_queries(
        str(queries.directory), cfg.queries, plan.embedding, terms, chunk_files, cfg.dataset.holdout_fraction
    )
    queries_file = queries.directory / "queries.parquet"
    compute_groundtruth(str(gt.directory), str(embed.directory), str(queries_file), cfg.groundtruth)
    return LocalDataset(
        dataset_dir=embed.directory,
        queries_file=queries_file,
        groundtruth_file=gt.directory / "groundtruth.parquet",
        metric=cfg.groundtruth.metric,
        key=gt.key,
    )


def load_collection(ctx: dict[str, Any], cfg: Any) -> dict[str, Any]:
    """The pipeline's insert -> searchable -> index stages (untimed set-up)."""
    from apps.vdb.stages.index import build_index
    from apps.vdb.stages.insert import insert_partition, prepare_collection, wait_searchable

    target = target_of(ctx)
    rows = len(ctx["data"]["ids"])
    started = time.monotonic()
    prepare_collection(target, True)
    record = insert_partition(target, ctx["data"]["units"], cfg.insert.batch_sizes[-1], 1, cfg.insert.retries)
    visible = wait_searchable(target, rows, cfg.insert.timeout_s, record)
    loaded = time.monotonic()
    index = build_index(target, rows, cfg.index_timeout_s, visible)
    return {"upload_s": loaded - started, "index_s": time.monotonic() - loaded, **index.model_dump()}
