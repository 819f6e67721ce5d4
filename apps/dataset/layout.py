"""The embed stage and the Pes2o-VE dataset layout.

One chunk shard becomes one ``part-NNNNN.parquet`` with columns ``id`` (int64), ``doc_id``, ``chunk_index``
and ``embedding`` (``fixed_size_list<float32|float16>[dim]``), zstd, bounded row groups, the model and
chunker recorded in the file metadata. ``manifest.json`` (written last) lists every part; ``README.md`` is
the dataset card. :func:`iter_vectors` reads the vectors back in batches without loading the dataset.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import Field

from core.config import Strict
from core.errors import ArtifactError, InputDataError
from core.format import table
from core.store import (
    SAFE_NAME,
    atomic_write_json,
    atomic_write_text,
    naming_damage,
    open_parquet,
    os_error_reason,
    read_manifest,
    verify_files,
    write_parquet_atomic,
)


class DatasetConfig(Strict):
    """The Parquet dataset (Pes2o-VE layout)."""

    name: str = Field("pes2o-ve", pattern=SAFE_NAME, description="Dataset name used in paths.")
    dir: str | None = Field(
        None,
        description="Write the dataset here instead of store/datasets/<name>-<model>-<key>/. An existing "
        "dataset there must have been made by the same configuration.",
    )
    row_group_rows: int = Field(
        4096,
        ge=64,
        description="Rows per Parquet row group (bounds read memory) of the dataset this run writes: a "
        "layout, not content, so not in its key; a dataset already written keeps its own.",
    )
    holdout_fraction: float = Field(
        0.0,
        ge=0.0,
        lt=0.5,
        description="Fraction of chunks held out of the dataset (chosen by a hash of chunk_id) to serve as "
        "queries when queries.source is 'holdout'.",
    )


STAGE_VERSION = "1"
METADATA_KEY = "pes2o_ve"
# Row ids are shard * ROW_ID_STRIDE + row: unique, deterministic, and known without a global barrier.
ROW_ID_STRIDE = 1_000_000_000


def row_id(shard: int, row: int) -> int:
    """The dataset id of row ``row`` of chunk shard ``shard``."""
    return shard * ROW_ID_STRIDE + row


def is_held_out(chunk_id: str, fraction: float) -> bool:
    """Deterministic hold-out choice by hash of the chunk id (the same chunks on every run)."""
    if fraction <= 0:
        return False
    value = int.from_bytes(hashlib.sha256(chunk_id.encode()).digest()[:8], "big")
    return value / 2**64 < fraction


def vectors_to_arrow(vectors: np.ndarray, dtype: str) -> pa.FixedSizeListArray:
    """(n, dim) array -> fixed_size_list column without a Python-level loop."""
    np_type = np.float16 if dtype == "float16" else np.float32
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np_type).ravel())
    return pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])


def part_name(shard: int) -> str:
    """The file name of dataset part ``shard``."""
    return f"part-{shard:05d}.parquet"


def write_part(
    out: Path,
    shard: int,
    ids: Any,
    vectors: np.ndarray,
    meta: dict[str, Any] | None,
    *,
    dtype: str = "float32",
    doc_ids: Any = None,
    chunk_indexes: Any = None,
    row_group_rows: int = 4096,
) -> dict[str, Any]:
    """Write dataset part ``shard`` into ``out`` atomically, ``meta`` in its file metadata; return its
    manifest record (``file``, ``shard``, ``rows``, ``bytes``, ``sha256``).

    ``doc_ids`` and ``chunk_indexes`` name each row's source chunk; vectors that have none (imported or
    drawn) leave them null.
    """
    rows = len(ids)
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "doc_id": pa.nulls(rows, pa.string()) if doc_ids is None else pa.array(doc_ids, pa.string()),
            "chunk_index": (
                pa.nulls(rows, pa.int32()) if chunk_indexes is None else pa.array(chunk_indexes, pa.int32())
            ),
            "embedding": vectors_to_arrow(vectors, dtype),
        }
    )
    metadata = {METADATA_KEY: json.dumps(meta, sort_keys=True)} if meta is not None else None
    name = part_name(shard)
    written = write_parquet_atomic(table, out / name, row_group_rows=row_group_rows, metadata=metadata)
    return {"file": name, "shard": shard, **written}


def arrow_to_vectors(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """fixed_size_list column -> (n, dim) float32 array."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    dim = column.type.list_size
    # A writable float32 copy: zero-copy views are read-only, which torch.from_numpy warns about.
    # flatten(), not .values: .values is the whole child array, ignoring a slice's offset and length.
    return np.array(column.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, dim)


def own_files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The queries and ground truth a dataset keeps beside its parts (an imported or drawn one; a dataset
    a run generated keeps them in store/queries and store/groundtruth): their manifest entries."""
    return [manifest[role] for role in ("queries", "groundtruth") if role in manifest]


def dataset_manifest(dataset_dir: Path) -> dict[str, Any]:
    """The manifest of a complete dataset folder; InputDataError naming the folder when it is none (a
    mistyped path is said to be missing, not "an incomplete dataset")."""
    manifest = read_manifest(dataset_dir)
    if manifest is None and not dataset_dir.is_dir():
        raise InputDataError(
            f"{dataset_dir}: no such folder (a dataset is a folder, store/datasets/<name>-<key>)"
        )
    if manifest is None or manifest.get("stage") != "embed":
        raise InputDataError(f"{dataset_dir}: not a complete dataset (no dataset manifest.json)")
    return manifest


def dataset_problems(dataset_dir: Path, manifest: dict[str, Any]) -> list[str]:
    """What is wrong with the files of a dataset folder: each part's size, and its own queries' and ground
    truth's size and sha256 (small files, read whole); empty when it is whole."""
    return verify_files(dataset_dir, manifest.get("files", [])) + verify_files(
        dataset_dir, own_files(manifest), checksums=True
    )


# What an interrupted dataset directory of this pipeline holds before its first shard record: parts,
# their temp files (".<name>.<random>.tmp" beside the target, see core.store), _shards/ and the write
# probe. README.md and manifest.json come last, after the records, so alone they are someone else's.
_PARTIAL = re.compile(r"^(part-\d{5}\.parquet|\.part-\d{5}\.parquet\..+\.tmp|_shards|\.probe\..+)$")


def check_dataset_dir(dataset_dir: Path, key: str, dimension: int) -> None:
    """Refuse to write into a directory that is not ours or holds a different dataset.

    ``dataset.dir`` is chosen by the user: a non-empty directory that is not a dataset of this pipeline
    (no embed manifest, no shard records, files we never write) is refused untouched, since writing
    there would overwrite its README.md with the dataset card and mix part files among its files. One
    that cannot be read (permissions) is an ArtifactError too, naming it.
    """
    try:
        _check_dataset_dir(dataset_dir, key, dimension)
    except OSError as exc:
        reason = os_error_reason(exc, dataset_dir)
        raise ArtifactError(f"dataset.dir {dataset_dir} cannot be read: {reason}") from None


def _check_dataset_dir(dataset_dir: Path, key: str, dimension: int) -> None:
    if not dataset_dir.exists():
        return
    if not dataset_dir.is_dir():
        raise ArtifactError(f"dataset.dir {dataset_dir} is a file, not a directory")
    existing = _existing_dataset(dataset_dir)
    if existing is None:
        foreign = sorted(p.name for p in dataset_dir.iterdir() if not _PARTIAL.match(p.name))
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise ArtifactError(
                f"dataset.dir {dataset_dir} is not empty and holds no dataset of this pipeline "
                f"(found {shown}); nothing was written there. Choose a new or empty directory."
            )
        return
    if existing.get("dimension") not in (None, dimension):
        raise ArtifactError(
            f"{dataset_dir} holds a dataset of dimension {existing['dimension']}; this configuration makes "
            f"dimension {dimension}. Choose another dataset.dir or remove the old dataset."
        )
    if existing.get("key") not in (None, key):
        raise ArtifactError(
            f"{dataset_dir} holds another dataset (content key {existing['key']}, this run {key}); "
            "choose another dataset.dir or remove it."
        )


def _existing_dataset(dataset_dir: Path) -> dict[str, Any] | None:
    """Key and dimension of the dataset in ``dataset_dir`` (from its manifest or a shard record)."""
    try:
        manifest = read_manifest(dataset_dir)
    except (ValueError, OSError):  # a manifest.json that is not JSON is not ours
        manifest = None
    if isinstance(manifest, dict) and manifest.get("stage") == "embed":
        return manifest
    for record_path in sorted(dataset_dir.glob("_shards/*.json")):
        try:
            record = json.loads(record_path.read_text())
        except (ValueError, OSError):
            continue
        if isinstance(record, dict) and "dataset_key" in record:
            return {"key": record.get("dataset_key"), "dimension": record.get("dimension")}
    return None


def finalize_dataset(
    dataset_dir: str,
    key: str,
    records: list[dict[str, Any]],
    file_metadata: dict[str, Any],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """Write the dataset card and, last, ``manifest.json`` listing every part; return the manifest.

    Refuses (ArtifactError, nothing written) parts made in different effective precisions.
    """
    out = Path(dataset_dir)
    parts = sorted(records, key=lambda r: r["shard"])
    precision = _one_precision(out, parts)
    manifest = {
        "stage": "embed",
        "version": STAGE_VERSION,
        "key": key,
        "dimension": file_metadata["dimension"],
        "precision": precision,
        "rows": sum(r["rows"] for r in parts),
        "bytes": sum(r["bytes"] for r in parts),
        "metadata": file_metadata,
        "files": [{k: v for k, v in r.items() if k != "cached"} for r in parts],
        **extra,
    }
    atomic_write_text(out / "README.md", dataset_card(manifest))
    atomic_write_json(out / "manifest.json", manifest)
    return manifest


def _one_precision(dataset_dir: Path, parts: list[dict[str, Any]]) -> str | None:
    """The precision every part was computed in (None: not recorded); ArtifactError when they differ.

    A bf16 config runs bf16 on a CPU with bf16 units and float32 on one without (OpenVINO falls back), and
    the vectors then differ by ~1e-3: a resumed run on another node must not mix them into one dataset.
    """
    groups: dict[str, list[str]] = {}
    for part in parts:
        if part.get("precision"):  # records written before precisions were recorded say nothing
            groups.setdefault(part["precision"], []).append(part["file"])
    if len(groups) <= 1:
        return next(iter(groups), None)
    listed = "; ".join(f"{p}: {', '.join(files)}" for p, files in sorted(groups.items()))
    fewest = min(groups.values(), key=len)
    raise ArtifactError(
        f"{dataset_dir}: the parts were computed in different precisions ({listed}), on CPUs with and "
        "without the units the configured dtype needs; the dataset is not marked complete. Rerun on uniform "
        f"hardware (delete the parts to redo, e.g. {', '.join(str(dataset_dir / f) for f in fewest)}, and "
        "rerun where the CPU runs the other precision), or set embedding.dtype: float32 (the same on any CPU)"
    )


def dataset_card(manifest: dict[str, Any]) -> str:
    """A Markdown dataset card from the manifest."""
    meta = manifest["metadata"]
    chunker = meta.get("chunking", {})
    properties = [
        ("rows (vectors)", f"{manifest['rows']:,}"),
        ("parts", f"{len(manifest['files'])} (`part-NNNNN.parquet`)"),
        ("dimension", manifest["dimension"]),
        ("stored dtype", meta.get("output_dtype")),
        ("model", f"{meta.get('model_id') or meta.get('model')} (revision {meta.get('revision') or 'n/a'})"),
        ("backend / compute dtype", f"{meta.get('backend')} / {meta.get('dtype')}"),
        ("precision as run", manifest.get("precision") or "not recorded"),
        ("pooling / normalised", f"{meta.get('pooling')} / {meta.get('normalize')}"),
        ("document instruction", "none (queries use `Instruct: {task}\\nQuery:{text}`)"),
        ("chunking", json.dumps(chunker, sort_keys=True)),
        ("content key", f"`{manifest['key']}`"),
    ]
    return f"""# {meta.get("dataset_name", "pes2o-ve")}

Embeddings of a scientific corpus in the Pes2o-VE layout, made by the pes2o-ve pipeline.

{chr(10).join(table(["property", "value"], properties, limit=None))}

## Columns
- `id` (int64): row id, `shard * {ROW_ID_STRIDE:,} + row` of the chunk shard; unique and stable.
- `doc_id` (string): id of the source document; `chunk_index` (int32): position of the chunk in it.
- `embedding` (fixed_size_list<{meta.get("output_dtype")}>[{manifest["dimension"]}]).

Each file's Parquet metadata key `{METADATA_KEY}` repeats the properties above as JSON; `manifest.json` lists
every part with rows, bytes, sha256, the chunk shard it came from, timings, host and Parsl worker.

## Source and licence
The bundled sample comes from peS2o-format abstracts (SciFact / S2ORC, ODC-By 1.0); see the corpus files'
own attribution. Embeddings inherit the corpus licence and the model's licence.
"""


def dataset_parts(dataset_dir: Path) -> list[Path]:
    """The part files listed by a complete dataset's manifest (ArtifactError when incomplete)."""
    manifest = read_manifest(dataset_dir)
    if manifest is None:
        raise ArtifactError(f"{dataset_dir}: no manifest.json; the dataset is not complete")
    return [dataset_dir / f["file"] for f in manifest["files"]]


def iter_vectors(dataset_dir: Path, batch_rows: int = 8192) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids, vectors float32) batches of at most ``batch_rows`` over the whole dataset, part by part.

    One row group is read at a time, so memory follows ``dataset.row_group_rows``, not the part:
    ``ParquetFile.iter_batches`` held a whole part (345 MiB of a 250,000 x 384 part, pyarrow 26) and the
    driver's peak grew with the dataset. Consumers that want larger blocks gather them (``rebatch``).
    """
    for part in dataset_parts(dataset_dir):
        with naming_damage(part):
            parquet = open_parquet(part)
        try:
            for group in range(parquet.num_row_groups):
                with naming_damage(part):
                    table = parquet.read_row_group(group, columns=["id", "embedding"])
                for batch in table.to_batches(max_chunksize=batch_rows):
                    yield batch.column("id").to_numpy(), arrow_to_vectors(batch.column("embedding"))
        finally:
            parquet.close()
