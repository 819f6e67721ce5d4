"""The embed stage: one chunk shard in, one dataset part (``part-NNNNN.parquet``) out.

The model itself (batching, pooling, backends) lives in :mod:`apps.dataset.embedding.model`; the dataset
layout (row ids, vector columns, parts) in :mod:`apps.dataset.layout`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from apps.dataset.layout import is_held_out, part_name, row_id, write_part
from apps.taskinfo import task_context
from core.store import read_shard_record, write_shard_record

if TYPE_CHECKING:
    from apps.dataset.embedding.model import EmbeddingConfig


def embed_shard(
    chunks_file: str,
    shard_index: int,
    dataset_dir: str,
    embedding: EmbeddingConfig,
    file_metadata: dict[str, Any],
    holdout_fraction: float,
    row_group_rows: int,
) -> dict[str, Any]:
    """Embed one chunk shard into ``part-NNNNN.parquet``; return its record (skips a verified part)."""
    from apps.dataset.embedding.model import get_embedder

    out = Path(dataset_dir)
    name = part_name(shard_index)
    if (done := read_shard_record(out, name)) is not None:
        return {**done, "cached": True}
    started = time.time()
    chunks = pq.read_table(chunks_file, columns=["chunk_id", "doc_id", "chunk_index", "text"]).to_pydict()
    ids = [row_id(shard_index, row) for row in range(len(chunks["chunk_id"]))]
    keep = [i for i, cid in enumerate(chunks["chunk_id"]) if not is_held_out(cid, holdout_fraction)]
    embedder = get_embedder(embedding)
    vectors, stats = embedder.embed([chunks["text"][i] for i in keep], is_query=False)
    part = write_part(
        out,
        shard_index,
        [ids[i] for i in keep],
        vectors,
        file_metadata,
        dtype=embedding.output_dtype,
        doc_ids=[chunks["doc_id"][i] for i in keep],
        chunk_indexes=[chunks["chunk_index"][i] for i in keep],
        row_group_rows=row_group_rows,
    )
    record = {
        **part,
        "input": Path(chunks_file).name,
        "held_out": len(ids) - len(keep),
        "dataset_key": file_metadata["dataset_key"],
        "dimension": file_metadata["dimension"],
        "embed": stats.__dict__,
        "device": embedder.device,
        "precision": embedder.precision,  # OpenVINO's as the plugin runs it (bf16 needs bf16 units)
        **({"export": embedder.export} if embedder.export else {}),
        **task_context(started),
    }
    write_shard_record(out, record)
    return record


def export_notice(embedding: EmbeddingConfig) -> str:
    """The console line before an OpenVINO embed stage: export found in the cache, or made once now.

    The driver asks (hashing the model directory, as each worker does): a worker's log never reaches the
    console, and the first shard is otherwise just slow.
    """
    from apps.dataset.embedding.backends import estimate_seconds, export_state

    target, problem = export_state(embedding.model, str(embedding.export_dir))
    name = embedding.model_id or Path(embedding.model).name
    if problem is None:
        return f"embed: OpenVINO export of {name} found in {target}"
    todo = f"exporting {name} to OpenVINO (once, ~{estimate_seconds(embedding.model)} s) into {target}"
    if problem != "missing":
        todo = f"the OpenVINO export {target} is broken ({problem}): moving it aside and {todo}"
    return f"embed: {todo}; the first shard waits for it"


def shard_notices(record: dict[str, Any], embedding: EmbeddingConfig, seen: set[str]) -> list[str]:
    """Console lines a finished OpenVINO embed shard warrants, each once per run (``seen`` remembers).

    The precision really used is only known on the worker: a bf16 config runs float32 on a CPU without
    bf16 units, and a dataset mixing both is refused when it is finalized.
    """
    lines: list[str] = []
    export, precision, host = record.get("export") or {}, record.get("precision"), record.get("host")
    if export.get("exported_by_worker") and "export" not in seen:
        seen.add("export")
        lines.append(
            f"embed: {host} exported the model to OpenVINO in {export['seconds']:.0f} s ({export['dir']})"
        )
    if precision and f"precision {precision}" not in seen:
        seen.add(f"precision {precision}")
        if precision == embedding.dtype:
            lines.append(f"embed: OpenVINO computes in {precision} on {host}")
        else:
            lines.append(
                f"embed: warning: dtype {embedding.dtype} asked, but the CPU of {host} runs {precision} (no "
                f"{embedding.dtype} units); parts made in different precisions cannot form one dataset: "
                "run on one CPU type, or set embedding.dtype: float32"
            )
    return lines
