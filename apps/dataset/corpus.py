"""Corpus readers (peS2o JSONL, BEIR JSONL, Parquet) and the streaming shard stage.

Readers yield one :class:`Document` at a time, so memory does not grow with the corpus. The shard stage
groups documents into Parquet shards of a target size in a deterministic order (sorted files, file order
inside), which makes the same input give the same shards.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, model_validator

from core.config import Strict
from core.errors import InputDataError
from core.store import atomic_write_json, complete_manifest, write_parquet_atomic


class CorpusConfig(Strict):
    """Where the documents come from and how to read them."""

    format: Literal["pes2o", "beir", "parquet"] = Field(
        "pes2o",
        description="pes2o: JSONL(.gz) records {id, text, source, added, created, version}; "
        "beir: JSONL {_id, title, text}; parquet: files with id and text columns.",
    )
    paths: list[Annotated[str, Field(min_length=1)]] = Field(  # "" would read the config's whole folder
        description="Files, directories (their files of the format, recursively: .json(l)[.gz] or .parquet) "
        "or glob patterns; relative paths are relative to the config file.",
        min_length=1,
    )
    id_column: str = Field("id", description="Parquet only: the column holding the document id.")
    text_column: str = Field("text", description="Parquet only: the column holding the document text.")
    max_documents: int | None = Field(
        None, ge=1, description="Read at most this many documents (a quick sample of a large corpus)."
    )
    on_invalid: Literal["error", "skip"] = Field(
        "error",
        description="A record without text or a line that is not UTF-8 JSON: stop with an error naming "
        "file and line, or skip it and count it in the manifest.",
    )


class ShardingConfig(Strict):
    """How documents are grouped into shards, the unit of parallel work and of resume."""

    docs_per_shard: int | None = Field(
        1000, ge=1, description="Target documents per shard (set this or bytes_per_shard)."
    )
    bytes_per_shard: int | None = Field(
        None, ge=1024, description="Target UTF-8 text bytes per shard; overrides docs_per_shard when set."
    )

    @model_validator(mode="after")
    def _one_limit_set(self) -> ShardingConfig:
        if self.docs_per_shard is None and self.bytes_per_shard is None:
            raise ValueError("set docs_per_shard or bytes_per_shard (both are null)")
        return self


STAGE_VERSION = "1"
DOC_SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string()), ("metadata", pa.string())])


@dataclass
class Document:
    """One corpus record: id, text, and every other field as metadata."""

    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    where: str = field(default="", compare=False)  # "file:line" or "file: row N", for error messages


@dataclass
class ReadStats:
    """What a read skipped (when the config says skip rather than error)."""

    skipped: list[str] = field(default_factory=list)


# The files a directory in corpus.paths contributes, by corpus format (a downloaded corpus folder also
# holds a README, a licence, other splits' metadata: read as records they would fail or be skipped).
CORPUS_SUFFIXES = {
    "pes2o": (".json", ".jsonl", ".json.gz", ".jsonl.gz"),
    "beir": (".json", ".jsonl", ".json.gz", ".jsonl.gz"),
    "parquet": (".parquet",),
}


def expand_paths(patterns: list[str], base: Path, suffixes: tuple[str, ...] | None = None) -> list[Path]:
    """Files named by paths, directories (the files inside, recursively, ending in one of ``suffixes``
    when given) or globs, sorted, deduplicated.

    Raises InputDataError naming the first pattern that matches nothing.
    """
    files: set[Path] = set()
    for pattern in patterns:
        path = Path(pattern).expanduser()
        path = path if path.is_absolute() else base / path
        if path.is_dir():
            found = [
                p
                for p in path.rglob("*")
                if p.is_file() and not p.name.startswith(".") and (not suffixes or p.name.endswith(suffixes))
            ]
            if not found and suffixes:
                raise InputDataError(
                    f"corpus path {pattern!r} (resolved to {path}) holds no file ending in "
                    f"{', '.join(suffixes)}"
                )
        elif any(ch in str(path) for ch in "*?["):
            found = [Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file()]
        else:
            found = [path] if path.is_file() else []
        if not found:
            raise InputDataError(f"corpus path {pattern!r} (resolved to {path}) matches no file")
        files.update(p.resolve() for p in found)
    return sorted(files)


def _open_text_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Yield (line number, raw bytes) of a .jsonl or .jsonl.gz file.

    A truncated or corrupt file raises InputDataError naming it and the last line read whole: gzip
    reports truncation as EOFError (which the CLI framework turns into a bare "Aborted.") and
    corruption as zlib.error or BadGzipFile, none of which names the file.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    line_no = 0
    try:
        with opener(path, "rb") as fh:
            for line_no, raw in enumerate(io.BufferedReader(fh), start=1):
                yield line_no, raw
    except EOFError:
        raise InputDataError(
            f"{path}: the gzip file is truncated {_after(line_no)} (it ends inside the compressed stream)"
        ) from None
    except (OSError, zlib.error) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputDataError(f"{path}: cannot read the file {_after(line_no)}: {detail}") from None


def _after(line_no: int) -> str:
    return f"after line {line_no}" if line_no else "at its start"


def _bad(where: str, message: str, on_invalid: str, stats: ReadStats) -> None:
    if on_invalid == "error":
        raise InputDataError(f"{where}: {message}")
    stats.skipped.append(f"{where}: {message}")


def read_jsonl(path: Path, fmt: str, on_invalid: str, stats: ReadStats) -> Iterator[Document]:
    """Documents of one peS2o or BEIR JSONL(.gz) file; bad lines raise or are skipped and recorded."""
    id_key = "id" if fmt == "pes2o" else "_id"
    for line_no, raw in _open_text_lines(path):
        where = f"{path}:{line_no}"
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            _bad(where, f"line is not UTF-8 ({exc.reason} at byte {exc.start})", on_invalid, stats)
            continue
        except json.JSONDecodeError as exc:
            _bad(where, f"line is not valid JSON ({exc.msg}, column {exc.colno})", on_invalid, stats)
            continue
        if not isinstance(record, dict):
            _bad(where, "record is not a JSON object", on_invalid, stats)
            continue
        doc_id = record.pop(id_key, None)
        if doc_id is None or str(doc_id) == "":
            _bad(where, f"record has no {id_key!r} field", on_invalid, stats)
            continue
        text = record.pop("text", None)
        if fmt == "beir":
            title = record.pop("title", "") or ""
            text = f"{title}\n\n{text}" if title and isinstance(text, str) else text
        if not isinstance(text, str) or not text.strip():
            _bad(where, f"record {doc_id!s} has no text", on_invalid, stats)
            continue
        yield Document(id=str(doc_id), text=text, metadata=record, where=where)


def read_parquet(
    path: Path, id_column: str, text_column: str, on_invalid: str, stats: ReadStats
) -> Iterator[Document]:
    """Documents of one Parquet file, read one record batch at a time.

    A file that is not Parquet (JSONL named .parquet, a truncated download) or whose pages do not
    decode raises InputDataError naming the file (and the last row read), not pyarrow's bare message.
    """
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise InputDataError(f"{path}: not a readable Parquet file ({_first_line(exc)})") from None
    names = parquet.schema_arrow.names
    for column in (id_column, text_column):
        if column not in names:
            raise InputDataError(f"{path}: no column {column!r} (columns: {', '.join(names)})")
    row = 0
    batches = parquet.iter_batches(batch_size=1024)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as exc:
            raise InputDataError(f"{path}: cannot read past row {row}: {_first_line(exc)}") from None
        if batch is None:
            return
        for record in batch.to_pylist():
            row += 1
            where = f"{path}: row {row}"
            doc_id, text = record.pop(id_column), record.pop(text_column)
            if doc_id is None:
                _bad(where, f"record has no {id_column!r}", on_invalid, stats)
            elif not isinstance(text, str) or not text.strip():
                _bad(where, f"record {doc_id!s} has no text", on_invalid, stats)
            else:
                yield Document(id=str(doc_id), text=text, metadata=record, where=where)


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message (pyarrow's run over several lines)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def iter_documents(files: list[Path], corpus: CorpusConfig, stats: ReadStats) -> Iterator[Document]:
    """All documents of the corpus in deterministic order, honouring max_documents."""
    produced = 0
    for path in files:
        if corpus.format == "parquet":
            docs = read_parquet(path, corpus.id_column, corpus.text_column, corpus.on_invalid, stats)
        else:
            docs = read_jsonl(path, corpus.format, corpus.on_invalid, stats)
        for doc in docs:
            yield doc
            produced += 1
            if corpus.max_documents and produced >= corpus.max_documents:
                return


def file_fingerprints(files: list[Path]) -> list[dict[str, Any]]:
    """Cheap identity of the input files (path, size, mtime) for the shard stage's content key."""
    return [{"path": str(p), "size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns} for p in files]


def _shard_table(docs: list[Document]) -> pa.Table:
    return pa.table(
        {
            "id": [d.id for d in docs],
            "text": [d.text for d in docs],
            "metadata": [json.dumps(d.metadata, sort_keys=True, default=str) for d in docs],
        },
        schema=DOC_SCHEMA,
    )


def _first_occurrence(paths: list[Path], corpus: CorpusConfig, doc_id: str) -> str:
    """Where ``doc_id`` first appears (read again on error: keeping every location costs memory)."""
    for doc in iter_documents(paths, corpus, ReadStats()):
        if doc.id == doc_id:
            return doc.where
    return "an earlier record"  # unreachable: the id was seen once already


def shard_corpus(
    files: list[str], corpus: CorpusConfig, sharding: ShardingConfig, out_dir: str
) -> dict[str, Any]:
    """Stream the corpus into ``docs-NNNNN.parquet`` shards under ``out_dir``; return the manifest.

    Rejects duplicate document ids (naming both places) and an empty corpus. Runs as one Parsl task:
    a single sequential pass keeps the shard plan deterministic. Memory is one shard of documents.
    """
    out = Path(out_dir)
    if (done := complete_manifest(out)) is not None:
        return done
    started = time.time()
    stats = ReadStats()
    seen: dict[str, int] = {}  # document id -> shard index, to name where a duplicate first appeared
    shards: list[dict[str, Any]] = []
    buffer: list[Document] = []
    buffered_bytes = 0
    max_docs, max_bytes = sharding.docs_per_shard, sharding.bytes_per_shard

    def flush() -> None:
        nonlocal buffer, buffered_bytes
        name = f"docs-{len(shards):05d}.parquet"
        written = write_parquet_atomic(_shard_table(buffer), out / name, row_group_rows=1024)
        shards.append({"file": name, "first_id": buffer[0].id, "last_id": buffer[-1].id, **written})
        buffer, buffered_bytes = [], 0

    paths = [Path(f) for f in files]
    for doc in iter_documents(paths, corpus, stats):
        if doc.id in seen:
            first = _first_occurrence(paths, corpus, doc.id)
            raise InputDataError(
                f"{doc.where}: duplicate document id {doc.id!r}: already in shard {seen[doc.id]}, at {first} "
                f"(document ids must be unique across {len(files)} corpus file(s))"
            )
        seen[doc.id] = len(shards)
        buffer.append(doc)
        buffered_bytes += len(doc.text.encode("utf-8"))
        if (max_bytes and buffered_bytes >= max_bytes) or (not max_bytes and len(buffer) >= max_docs):
            flush()
    if buffer:
        flush()
    if not shards:
        raise InputDataError(f"the corpus is empty: no document in {', '.join(files)}")
    manifest = {
        "stage": "shard",
        "version": STAGE_VERSION,
        "documents": sum(s["rows"] for s in shards),
        "skipped": len(stats.skipped),
        "skipped_examples": stats.skipped[:20],
        "files": shards,
        "inputs": files,
        "started": started,
        "finished": time.time(),
    }
    atomic_write_json(out / "manifest.json", manifest)
    return manifest
