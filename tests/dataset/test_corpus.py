"""Corpus readers and the shard stage: formats, determinism, streaming, bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apps.dataset.corpus import (
    CORPUS_SUFFIXES,
    CorpusConfig,
    ReadStats,
    ShardingConfig,
    expand_paths,
    iter_documents,
    shard_corpus,
)
from core.errors import InputDataError
from core.store import read_manifest
from tests.conftest import sample_records, write_jsonl

CORPUS = {
    "format": "pes2o",
    "id_column": "id",
    "text_column": "text",
    "max_documents": None,
    "on_invalid": "error",
}


def as_config(corpus: dict) -> CorpusConfig:
    """The typed corpus section the stage receives (paths are resolved by the plan, not read here)."""
    return CorpusConfig(paths=["-"], **corpus)


def shard(files: list[Path], out: Path, corpus=None, **sharding) -> dict:
    sharding = {
        "docs_per_shard": sharding.get("docs_per_shard", 10),
        "bytes_per_shard": sharding.get("bytes_per_shard"),
    }
    return shard_corpus(
        [str(f) for f in files], as_config({**CORPUS, **(corpus or {})}), ShardingConfig(**sharding), str(out)
    )


def test_pes2o_gz_keeps_extra_fields_as_metadata(tmp_path: Path) -> None:
    records = sample_records(5)
    records[0]["added"] = "2023-01-01"
    path = tmp_path / "c.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    docs = list(iter_documents([path], as_config(CORPUS), ReadStats()))
    assert [d.id for d in docs] == [r["id"] for r in records]
    assert docs[0].metadata["added"] == "2023-01-01"
    assert docs[0].metadata["source"] == records[0]["source"]
    assert "text" not in docs[0].metadata


def test_beir_joins_title_and_text(shared_data: Path) -> None:
    path = shared_data / "scifact" / "corpus.jsonl"
    corpus = {**CORPUS, "format": "beir", "max_documents": 3}
    docs = list(iter_documents([path], as_config(corpus), ReadStats()))
    assert len(docs) == 3
    first = json.loads(path.open().readline())
    assert docs[0].id == first["_id"]
    assert docs[0].text == f"{first['title']}\n\n{first['text']}"


def test_parquet_reader_with_configured_columns(tmp_path: Path) -> None:
    records = sample_records(7)
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"pid": [r["id"] for r in records], "body": [r["text"] for r in records]}), path)
    corpus = {**CORPUS, "format": "parquet", "id_column": "pid", "text_column": "body"}
    docs = list(iter_documents([path], as_config(corpus), ReadStats()))
    assert [d.text for d in docs] == [r["text"] for r in records]
    with pytest.raises(InputDataError, match="no column 'id'"):
        list(iter_documents([path], as_config(CORPUS | {"format": "parquet"}), ReadStats()))


def test_directory_and_glob_expand_sorted(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d" / "b.jsonl", sample_records(2))
    write_jsonl(tmp_path / "d" / "a.jsonl", sample_records(2))
    assert [p.name for p in expand_paths(["d"], tmp_path)] == ["a.jsonl", "b.jsonl"]
    assert [p.name for p in expand_paths(["d/*.jsonl"], tmp_path)] == ["a.jsonl", "b.jsonl"]
    with pytest.raises(InputDataError, match="matches no file"):
        expand_paths(["missing/*.jsonl"], tmp_path)


def test_a_directory_gives_the_files_of_the_corpus_format(tmp_path: Path) -> None:
    """A downloaded corpus folder holds a README and a licence beside the records: a directory in
    corpus.paths gives only the format's files (they were read as records and failed or were skipped)."""
    write_jsonl(tmp_path / "d" / "part-0.jsonl", sample_records(2))
    (tmp_path / "d" / "sub").mkdir()
    (tmp_path / "d" / "sub" / "part-1.json.gz").write_bytes(b"")
    (tmp_path / "d" / "README.md").write_text("# peS2o")
    (tmp_path / "d" / "LICENSE").write_text("ODC-By")
    suffixes = CORPUS_SUFFIXES["pes2o"]
    assert [p.name for p in expand_paths(["d"], tmp_path, suffixes)] == ["part-0.jsonl", "part-1.json.gz"]
    with pytest.raises(InputDataError, match=r"holds no file ending in \.parquet"):
        expand_paths(["d"], tmp_path, CORPUS_SUFFIXES["parquet"])


def test_shard_plan_is_deterministic(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", sample_records(35))
    first = shard([corpus], tmp_path / "one")
    second = shard([corpus], tmp_path / "two")
    assert [f["rows"] for f in first["files"]] == [10, 10, 10, 5]
    assert [f["sha256"] for f in first["files"]] == [f["sha256"] for f in second["files"]]
    table = pq.read_table(tmp_path / "one" / "docs-00001.parquet")
    assert table.column("id").to_pylist() == [r["id"] for r in sample_records(20)[10:]]


def test_bytes_per_shard(tmp_path: Path) -> None:
    records = sample_records(30)
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    manifest = shard([corpus], tmp_path / "out", docs_per_shard=None, bytes_per_shard=5000)
    assert len(manifest["files"]) > 1
    assert sum(f["rows"] for f in manifest["files"]) == 30


def test_record_without_text_names_file_and_line(tmp_path: Path) -> None:
    records = sample_records(4)
    del records[2]["text"]
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    with pytest.raises(InputDataError, match=rf"{corpus}:3: record {records[2]['id']} has no text"):
        shard([corpus], tmp_path / "out")
    assert read_manifest(tmp_path / "out") is None  # nothing marked complete


def test_non_utf8_line_names_file_and_line(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    lines = [json.dumps(r).encode() for r in sample_records(3)]
    lines.insert(1, b'{"id": "bad", "text": "caf\xe9"}')
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(InputDataError, match=rf"{corpus}:2: line is not UTF-8"):
        shard([corpus], tmp_path / "out")
    assert read_manifest(tmp_path / "out") is None


def test_skip_mode_counts_bad_records(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    lines = [json.dumps(r).encode() for r in sample_records(5)]
    lines.insert(2, b"\xff\xfe not utf-8")
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    manifest = shard([corpus], tmp_path / "out", corpus={"on_invalid": "skip"})
    assert manifest["documents"] == 5
    assert manifest["skipped"] == 1
    assert ":3:" in manifest["skipped_examples"][0]


def test_duplicate_ids_are_rejected(tmp_path: Path) -> None:
    records = sample_records(15)
    a = write_jsonl(tmp_path / "a.jsonl", records[:12])
    b = write_jsonl(tmp_path / "b.jsonl", [records[3]])
    with pytest.raises(
        InputDataError, match=rf"duplicate document id '{records[3]['id']}': already in shard 0"
    ):
        shard([a, b], tmp_path / "out")
    assert read_manifest(tmp_path / "out") is None


def test_empty_corpus(tmp_path: Path) -> None:
    corpus = tmp_path / "empty.jsonl"
    corpus.write_text("\n\n")
    with pytest.raises(InputDataError, match="the corpus is empty"):
        shard([corpus], tmp_path / "out")


def test_max_documents(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", sample_records(30))
    manifest = shard([corpus], tmp_path / "out", corpus={"max_documents": 12})
    assert manifest["documents"] == 12
