"""The chunk stage: documents -> chunks measured in the embedding model's tokens.

Methods (chosen by ``chunking.method``):
* ``none``: one chunk per document (the earlier Qwen3/peS2o study);
* ``recursive``: langchain's RecursiveCharacterTextSplitter driven by the model's tokenizer;
* ``semantic``: split between sentence windows whose embedding similarity drops, then re-split anything
  longer than ``max_chunk_size`` recursively.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, model_validator

from apps.dataset.embedding.loading import load_tokenizer
from apps.taskinfo import task_context
from core.config import Strict
from core.store import read_shard_record, write_parquet_atomic, write_shard_record

if TYPE_CHECKING:
    from apps.dataset.embedding.model import EmbeddingConfig


class NoChunking(Strict):
    """One embedding per whole document (as the Qwen3/peS2o study did)."""

    method: Literal["none"] = "none"
    tokenizer: str | None = Field(
        None, description="Tokenizer used to count tokens; default: the embedding model's tokenizer."
    )


class RecursiveChunking(Strict):
    """langchain's RecursiveCharacterTextSplitter measured in the embedding model's tokens."""

    method: Literal["recursive"] = "recursive"
    chunk_size: int = Field(256, ge=8, description="Maximum chunk length in tokens, special tokens excluded.")
    chunk_overlap: int = Field(32, ge=0, description="Tokens shared by consecutive chunks.")
    tokenizer: str | None = Field(
        None,
        description="Tokenizer (path or package reference) that measures chunks; default: the embedding "
        "model's. Models sharing a tokenizer share chunks.",
    )

    @model_validator(mode="after")
    def _overlap_below_size(self) -> RecursiveChunking:
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError(f"chunk_overlap ({self.chunk_overlap}) must be < chunk_size ({self.chunk_size})")
        return self


class SemanticChunking(Strict):
    """Breakpoints where the similarity of adjacent sentence windows drops; long chunks re-split."""

    method: Literal["semantic"] = "semantic"
    window: int = Field(1, ge=1, description="Sentences on each side forming the window compared.")
    breakpoint_percentile: float = Field(
        90.0, gt=0, lt=100, description="Split where the distance between windows exceeds this percentile."
    )
    max_chunk_size: int = Field(256, ge=8, description="Chunks longer than this (tokens) are split again.")
    chunk_overlap: int = Field(0, ge=0, description="Token overlap used by the second, recursive split.")
    tokenizer: str | None = Field(None, description="Tokenizer that measures chunks; default: the model's.")


ChunkingConfig = Annotated[NoChunking | RecursiveChunking | SemanticChunking, Field(discriminator="method")]


STAGE_VERSION = "2"  # 2: offsets found by search (langchain start_index was -1 for some)
CHUNK_SCHEMA = pa.schema(
    [
        ("chunk_id", pa.string()),
        ("doc_id", pa.string()),
        ("chunk_index", pa.int32()),
        ("text", pa.string()),
        ("n_tokens", pa.int32()),
        ("char_start", pa.int64()),
        ("char_end", pa.int64()),
    ]
)

# A sentence ends at . ! ? followed by whitespace and an upper-case letter, digit or opening bracket.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[])")


def chunk_id(doc_id: str, index: int) -> str:
    """Deterministic chunk id: document id and chunk index."""
    return f"{doc_id}#{index}"


def _recursive_splitter(tokenizer, chunk_size: int, overlap: int):
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    return RecursiveCharacterTextSplitter.from_huggingface_tokenizer(
        tokenizer, chunk_size=chunk_size, chunk_overlap=overlap
    )


def split_recursive(text: str, splitter) -> list[tuple[int, int]]:
    """Character spans of the recursive splitter's chunks of ``text``.

    Offsets are found here rather than with langchain's ``add_start_index``, which reports -1 for
    some overlapping chunks. Chunks come in text order, so each is searched after the previous start.
    """
    spans: list[tuple[int, int]] = []
    for piece in splitter.split_text(text):
        cursor = spans[-1][0] + 1 if spans else 0
        start = text.find(piece, cursor)
        if start < 0:
            start = text.find(piece)
        if start < 0:  # the splitter changed the text (it only strips whitespace): a bug to report
            raise ValueError(f"chunk not found in its document: {piece[:60]!r}")
        spans.append((start, start + len(piece)))
    return spans


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Character spans of sentences (a rule-based splitter; good enough to place breakpoints)."""
    spans, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        spans.append((start, match.start()))
        start = match.end()
    if start < len(text):
        spans.append((start, len(text)))
    return [(s, e) for s, e in spans if text[s:e].strip()]


def semantic_breakpoints(window_vectors: np.ndarray, percentile: float) -> list[int]:
    """Indices i where a chunk ends after sentence i: cosine distance of adjacent windows above percentile."""
    if len(window_vectors) < 2:
        return []
    v = window_vectors / np.maximum(np.linalg.norm(window_vectors, axis=1, keepdims=True), 1e-12)
    distances = 1.0 - np.sum(v[:-1] * v[1:], axis=1)
    threshold = np.percentile(distances, percentile)
    return [i for i, d in enumerate(distances) if d > threshold]


def split_semantic(
    text: str, embed: Callable[[list[str]], np.ndarray], window: int, percentile: float
) -> list[tuple[int, int]]:
    """Character spans of semantic chunks (before the maximum-size re-split)."""
    sentences = split_sentences(text)
    if len(sentences) <= 1:
        return [(0, len(text))]
    windows = [
        text[sentences[max(0, i - window)][0] : sentences[min(len(sentences) - 1, i + window)][1]]
        for i in range(len(sentences))
    ]
    cuts = semantic_breakpoints(embed(windows), percentile)
    spans, first = [], 0
    for cut in [*cuts, len(sentences) - 1]:
        spans.append((sentences[first][0], sentences[cut][1]))
        first = cut + 1
    return spans


class Chunker:
    """Turns one document's text into chunk spans and token counts, per the chunking config."""

    def __init__(self, chunking: ChunkingConfig, tokenizer_dir: str, embed_fn=None) -> None:
        self.cfg = chunking
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.method = chunking.method
        size = getattr(chunking, "chunk_size", None) or getattr(chunking, "max_chunk_size", None)
        overlap = getattr(chunking, "chunk_overlap", 0)
        self.splitter = _recursive_splitter(self.tokenizer, size, overlap) if size else None
        self.embed_fn = embed_fn

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Token counts without special tokens."""
        if not texts:
            return []
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the chunks of ``text``."""
        if self.method == "none":
            return [(0, len(text))]
        if self.method == "recursive":
            return split_recursive(text, self.splitter)
        coarse = split_semantic(text, self.embed_fn, self.cfg.window, self.cfg.breakpoint_percentile)
        limit = self.cfg.max_chunk_size
        spans = []
        for (start, end), n in zip(coarse, self.count_tokens([text[s:e] for s, e in coarse]), strict=True):
            if n <= limit:
                spans.append((start, end))
            else:  # too long: split again recursively, keeping absolute offsets
                spans.extend(
                    (start + s, start + e) for s, e in split_recursive(text[start:end], self.splitter)
                )
        return spans


def chunk_shard(
    docs_file: str,
    out_dir: str,
    shard_index: int,
    chunking: ChunkingConfig,
    tokenizer_dir: str,
    embedding: EmbeddingConfig | None = None,
) -> dict[str, Any]:
    """Chunk one document shard into ``chunks-NNNNN.parquet``; return its shard record (skips if done).

    Semantic chunking loads the embedding model on this worker's device
    (:func:`apps.dataset.embedding.model.get_embedder`), so the DAG runs it on the model's workers, not the
    CPU block (``pipeline.dag.chunk_label``).
    """
    out = Path(out_dir)
    name = f"chunks-{shard_index:05d}.parquet"
    if (done := read_shard_record(out, name)) is not None:
        return {**done, "cached": True}
    started = time.time()
    embed_fn = None
    if chunking.method == "semantic":
        from apps.dataset.embedding.model import get_embedder

        embedder = get_embedder(embedding)
        embed_fn = lambda texts: embedder.embed(texts, is_query=False)[0]  # noqa: E731
    chunker = Chunker(chunking, tokenizer_dir, embed_fn)
    columns: dict[str, list] = {field.name: [] for field in CHUNK_SCHEMA}
    docs = pq.read_table(docs_file, columns=["id", "text"]).to_pydict()
    for doc_id, text in zip(docs["id"], docs["text"], strict=True):
        spans = chunker.spans(text)
        pieces = [text[s:e] for s, e in spans]
        for index, ((start, end), piece, n_tokens) in enumerate(
            zip(spans, pieces, chunker.count_tokens(pieces), strict=True)
        ):
            columns["chunk_id"].append(chunk_id(doc_id, index))
            columns["doc_id"].append(doc_id)
            columns["chunk_index"].append(index)
            columns["text"].append(piece)
            columns["n_tokens"].append(n_tokens)
            columns["char_start"].append(start)
            columns["char_end"].append(end)
    table = pa.table(columns, schema=CHUNK_SCHEMA)
    written = write_parquet_atomic(table, out / name, row_group_rows=2048)
    record = {
        "file": name,
        "shard": shard_index,
        "input": Path(docs_file).name,
        "documents": len(docs["id"]),
        "tokens": int(sum(columns["n_tokens"])),
        **written,
        **task_context(started),
    }
    write_shard_record(out, record)
    return record
