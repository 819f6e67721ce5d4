"""The queries stage: a term list (or held-out corpus chunks) embedded with the query instruction."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, model_validator

from apps.dataset.layout import is_held_out, row_id, vectors_to_arrow
from apps.taskinfo import task_context
from core.config import Strict
from core.errors import ArtifactError, InputDataError
from core.store import atomic_write_json, complete_manifest, write_parquet_atomic

if TYPE_CHECKING:
    from apps.dataset.embedding.model import EmbeddingConfig


class QueriesConfig(Strict):
    """Where the queries come from."""

    source: Literal["terms", "holdout"] = Field(
        "terms", description="terms: one query per line of terms_file; holdout: the held-out corpus chunks."
    )
    terms_file: str | None = Field(None, description="Term list, one per line (terms source).")
    limit: int | None = Field(None, ge=1, description="Use at most this many queries (the first N).")
    instruction: bool = Field(True, description="Embed queries with the instruction format.")

    @model_validator(mode="after")
    def _terms_need_file(self) -> QueriesConfig:
        if self.source == "terms" and not self.terms_file:
            raise ValueError("queries.source 'terms' needs terms_file")
        return self


STAGE_VERSION = "1"


def read_terms(path: Path, limit: int | None = None) -> list[str]:
    """Non-empty lines of a term list (UTF-8), in file order; errors name the file and line."""
    terms = []
    with open(path, "rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            try:
                term = raw.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                raise InputDataError(f"{path}:{line_no}: line is not UTF-8 ({exc.reason})") from None
            if term:
                terms.append(term)
                if limit and len(terms) >= limit:
                    break
    if not terms:
        raise InputDataError(f"{path}: the term list is empty")
    return terms


def held_out_chunks(
    chunk_files: list[str], fraction: float, limit: int | None
) -> tuple[list[int], list[str]]:
    """Row ids and texts of the chunks the embed stage held out of the dataset."""
    ids, texts = [], []
    for shard, path in enumerate(chunk_files):
        table = pq.read_table(path, columns=["chunk_id", "text"]).to_pydict()
        for row, (cid, text) in enumerate(zip(table["chunk_id"], table["text"], strict=True)):
            if is_held_out(cid, fraction):
                ids.append(row_id(shard, row))
                texts.append(text)
                if limit and len(ids) >= limit:
                    return ids, texts
    return ids, texts


def build_queries(
    out_dir: str,
    queries: QueriesConfig,
    embedding: EmbeddingConfig,
    terms_path: str | None,
    chunk_files: list[str],
    holdout_fraction: float,
    precision: str | None = None,
) -> dict[str, Any]:
    """Embed the queries into ``queries.parquet`` (id, text, embedding) and write the manifest.

    ``precision``: the dataset's effective precision (its manifest's); queries computed in another one
    are refused before anything is written (a CPU without bf16 units runs bfloat16 as float32).
    """
    from apps.dataset.embedding.model import get_embedder

    out = Path(out_dir)
    if (done := complete_manifest(out)) is not None:
        return {**done, "cached": True}
    started = time.time()
    if queries.source == "terms":
        texts = read_terms(Path(terms_path), queries.limit)
        ids = list(range(len(texts)))
    else:
        ids, texts = held_out_chunks(chunk_files, holdout_fraction, queries.limit)
        if not texts:
            raise InputDataError("no chunk was held out: raise dataset.holdout_fraction")
    embedder = get_embedder(embedding)
    if precision and embedder.precision != precision:
        raise ArtifactError(
            f"the dataset was computed in {precision}, but this worker ({socket.gethostname()}) computes "
            f"the queries in {embedder.precision}; queries and dataset must share one precision: run the "
            "queries on the kind of CPU the dataset ran on, or set embedding.dtype: float32 (the same on any "
            "CPU)"
        )
    vectors, stats = embedder.embed(texts, is_query=True, instruction=queries.instruction)
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "text": pa.array(texts, pa.string()),
            "embedding": vectors_to_arrow(vectors, "float32"),
        }
    )
    written = write_parquet_atomic(table, out / "queries.parquet", row_group_rows=4096)
    manifest = {
        "stage": "queries",
        "version": STAGE_VERSION,
        "source": queries.source,
        "terms_file": terms_path,
        "count": len(texts),
        "dimension": int(vectors.shape[1]),
        "instruction": queries.instruction,
        "precision": embedder.precision,
        "embed": stats.__dict__,
        "files": [{"file": "queries.parquet", **written}],
        **task_context(started),
    }
    atomic_write_json(out / "manifest.json", manifest)
    return manifest
