"""The data of ``benchmarks/peer_vectordbbench.py``: the dataset ``configs/local.yaml`` builds, and its export
to VectorDBBench's custom-dataset layout.

:func:`local_dataset` plans ``configs/local.yaml`` with the work directory set to the repository (the store a
``make run`` uses, so either reuses the other's stages) and runs whatever dataset stage is not complete yet
with the project's own stage functions, in this process: shard -> chunk -> embed -> queries -> ground truth.

:func:`export_vdbbench` writes what VectorDBBench's ``PerformanceCustomDataset`` reads:

* ``train.parquet``: ``id`` (int64, the dataset row id) and ``emb`` (list<float32>), every dataset row;
* ``test.parquet``: ``id`` (int64, the query id) and ``emb``, every query of ``queries.parquet``;
* ``neighbors.parquet``: ``id`` (the query id) and ``neighbors_id`` (list<int64>): the project's exact
  ground truth (``groundtruth.parquet``), nearest first, in query order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
import numpy as np
import pyarrow.parquet as pq

EXPORT_FILES = ("train.parquet", "test.parquet", "neighbors.parquet")


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
            str(self.dataset_dir.relative_to(_common.REPO))
            if self.dataset_dir.is_relative_to(_common.REPO)
            else str(self.dataset_dir)
        )


def local_plan(workdir: Path = _common.REPO) -> Any:
    """The plan of ``configs/local.yaml`` with its store under ``workdir``."""
    from pipeline.config.loader import load_config
    from pipeline.plan import build_plan

    os.environ["PIPELINE_WORKDIR"] = str(workdir)
    return build_plan(load_config(_common.LOCAL_CONFIG))


def local_dataset(workdir: Path = _common.REPO) -> LocalDataset:
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
        raise SystemExit(f"{_common.LOCAL_CONFIG}: no queries section; the peer benchmark needs queries")
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


def read_base(dataset_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ids, float32 vectors) of every dataset row, in dataset order."""
    from apps.dataset.layout import iter_vectors

    parts = list(iter_vectors(dataset_dir))
    return np.concatenate([i for i, _ in parts]), np.concatenate([v for _, v in parts])


def read_groundtruth(groundtruth_file: Path) -> tuple[np.ndarray, np.ndarray]:
    """(query ids, neighbour ids (queries, k)) of a ``groundtruth.parquet``."""
    from apps.interchange.exporter import read_groundtruth as read_with_distances

    query_ids, neighbors, _ = read_with_distances(groundtruth_file)
    return query_ids, neighbors


def export_vdbbench(data: LocalDataset, out_dir: Path) -> dict[str, Any]:
    """Write ``train.parquet``, ``test.parquet`` and ``neighbors.parquet`` into ``out_dir`` (once: skipped
    when all three exist); return the custom-dataset description VectorDBBench needs."""
    from apps.dataset.layout import iter_vectors
    from apps.interchange.exporter import write_vdbbench
    from apps.vdb.stages.query_sweep import read_queries

    query_ids, query_vectors = read_queries(str(data.queries_file), None)
    gt_ids, neighbors = read_groundtruth(data.groundtruth_file)
    if not np.array_equal(query_ids, gt_ids):
        raise SystemExit(
            f"{data.groundtruth_file}: query ids differ from {data.queries_file} (order or members)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    if not all((out_dir / name).exists() for name in EXPORT_FILES):
        write_vdbbench(out_dir, iter_vectors(data.dataset_dir), query_ids, query_vectors, gt_ids, neighbors)
    rows = pq.read_metadata(out_dir / "train.parquet").num_rows
    return {
        "dir": str(out_dir),
        "size": rows,
        "dim": int(query_vectors.shape[1]),
        "metric_type": {"cosine": "COSINE", "ip": "IP", "l2": "L2"}[data.metric],
        "queries": len(query_ids),
        "gt_width": int(neighbors.shape[1]),
    }
