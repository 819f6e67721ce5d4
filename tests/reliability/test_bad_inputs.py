"""Bad inputs and unusable directories end in one clear line, a non-zero exit and nothing marked complete.

Each case runs the CLI as a user does. Permission cases use a path under a regular file (ENOTDIR):
chmod does not stop root, which is who runs the tests here and in CI.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import base_config, run_cli, sample_records, write_jsonl


def jsonl_bytes(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def config_for(tmp_path: Path, corpus_file: Path, **sections: Any) -> Path:
    """A small config over ``corpus_file``, workdir tmp_path/wd unless given (no queries: faster)."""
    workdir = Path(sections.pop("workdir", tmp_path / "wd"))
    config = base_config(corpus_file, workdir, queries=None)
    for name, value in sections.items():  # base_config's own first parameter is called corpus
        config[name] = {**config.get(name, {}), **value}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def assert_clean_failure(result, *named: str, store: Path | None = None) -> str:
    """Non-zero exit, every string of ``named`` in one stderr line, no traceback, nothing complete."""
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-2000:]
    assert "Traceback" not in output and "Aborted" not in output, output[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr[-2000:]
    for text in named:
        assert text in lines[0], lines[0]
    if store is not None and store.exists():
        assert not list(store.rglob("manifest.json")), "a failed stage was marked complete"
    return lines[0]


def failed_runs(workdir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((workdir / "runs").glob("*/provenance.json"))]


# --- corpus files that cannot be read ----------------------------------------------------------------


def test_truncated_gzip_corpus_names_the_file(tmp_path: Path) -> None:
    """gzip's EOFError used to reach click, which printed only ``Aborted.``."""
    data = gzip.compress(jsonl_bytes(sample_records(40)))
    corpus = tmp_path / "c.jsonl.gz"
    corpus.write_bytes(data[: len(data) // 2])
    result = run_cli("run", str(config_for(tmp_path, corpus)))
    store = tmp_path / "wd" / "store"
    line = assert_clean_failure(result, str(corpus), "truncated", "after line", store=store)
    assert result.returncode == 3, line
    prov = failed_runs(tmp_path / "wd")
    assert prov and prov[-1]["status"] == "failed" and "truncated" in prov[-1]["error"]


def test_corrupt_gzip_corpus_names_the_file(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(jsonl_bytes(sample_records(40))))
    for i in range(200, 400):  # flip bytes inside the deflate stream
        data[i] ^= 0xFF
    corpus = tmp_path / "c.jsonl.gz"
    corpus.write_bytes(bytes(data))
    result = run_cli("run", str(config_for(tmp_path, corpus)))
    assert_clean_failure(result, str(corpus), "cannot read the file", store=tmp_path / "wd" / "store")
    assert result.returncode == 3


def test_plain_jsonl_named_gz_names_the_file(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl.gz"
    corpus.write_bytes(jsonl_bytes(sample_records(12)))
    result = run_cli("run", str(config_for(tmp_path, corpus)))
    assert_clean_failure(result, str(corpus), "Not a gzipped file", store=tmp_path / "wd" / "store")


def test_parquet_corpus_that_is_jsonl_names_the_file(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.parquet", sample_records(12))
    config = config_for(tmp_path, corpus, corpus={"format": "parquet", "paths": [str(corpus)]})
    result = run_cli("run", str(config))
    assert_clean_failure(result, str(corpus), "not a readable Parquet file", store=tmp_path / "wd" / "store")
    assert result.returncode == 3


def test_duplicate_document_ids_name_both_lines(tmp_path: Path) -> None:
    records = sample_records(12)
    first = tmp_path / "a.jsonl"
    write_jsonl(first, records)
    second = write_jsonl(tmp_path / "b.jsonl", [sample_records(20)[15], records[3]])
    config = config_for(tmp_path, first, corpus={"paths": [str(first), str(second)]})
    result = run_cli("run", str(config))
    line = assert_clean_failure(
        result, f"{second}:2", f"{first}:4", repr(records[3]["id"]), store=tmp_path / "wd" / "store"
    )
    assert "duplicate document id" in line and result.returncode == 3


# --- directories that cannot be written ---------------------------------------------------------------


def test_workdir_under_a_file_is_a_config_error(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", sample_records(12))
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory\n")
    config = config_for(tmp_path, corpus, workdir=str(blocker / "wd"))
    for command in ("validate", "plan", "run"):  # told before anything runs, by each of them
        result = run_cli(command, str(config))
        assert_clean_failure(result, f"{config}:", "workdir", f"{blocker} is a file, not a directory")
        assert result.returncode == 2
    assert blocker.read_text() == "not a directory\n"


def test_runs_directory_not_writable(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", sample_records(12))
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "runs").write_text("")
    result = run_cli("run", str(config_for(tmp_path, corpus)))
    assert_clean_failure(result, "workdir", "cannot create runs/ under", "runs is a file")
    assert result.returncode == 2
    assert not (tmp_path / "wd" / "store").exists()


def test_store_not_writable(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", sample_records(12))
    (tmp_path / "wd").mkdir()
    store = tmp_path / "wd" / "store"
    store.write_text("")
    result = run_cli("run", str(config_for(tmp_path, corpus)))
    assert_clean_failure(result, "workdir", "cannot create store/ under", f"{store} is a file")
    assert result.returncode == 2
    assert not (tmp_path / "wd" / "runs").exists()  # refused at the plan: no run was started


# --- dataset.dir pointing at someone else's directory --------------------------------------------------


FOREIGN = [{"README.md": "my notes\n", "data.csv": "a,b\n1,2\n"}, {"README.md": "only a readme\n"}]


@pytest.mark.parametrize("files", FOREIGN)
def test_dataset_dir_in_a_foreign_directory_is_refused(tmp_path: Path, files: dict[str, str]) -> None:
    """Used to overwrite the user's README.md with the dataset card and add part files beside theirs."""
    corpus = write_jsonl(tmp_path / "c.jsonl", sample_records(12))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    for name, text in files.items():
        (theirs / name).write_text(text)
    before = {p.name: p.read_bytes() for p in theirs.iterdir()}
    config = config_for(tmp_path, corpus, dataset={"dir": str(theirs)})
    for command in ("plan", "run"):  # plan says it too, not only the run
        result = run_cli(command, str(config))
        assert_clean_failure(result, str(theirs), "holds no dataset of this pipeline", "README.md")
        assert result.returncode == 4
    assert not (tmp_path / "wd" / "runs").exists()  # refused before the run made its directory
    assert {p.name: p.read_bytes() for p in theirs.iterdir()} == before  # nothing added or changed


def test_dataset_dir_checks_accept_our_own_partial_and_finished_datasets(tmp_path: Path) -> None:
    """A dataset interrupted before its first shard record, or a finished one, is resumed, not refused."""
    from apps.dataset.layout import check_dataset_dir
    from core.errors import ArtifactError

    partial = tmp_path / "partial"
    (partial / "_shards").mkdir(parents=True)
    (partial / "part-00000.parquet").write_bytes(b"")
    (partial / ".part-00001.parquet.abc123.tmp").write_bytes(b"")
    check_dataset_dir(partial, "k1", 384)

    recorded = tmp_path / "recorded"
    (recorded / "_shards").mkdir(parents=True)
    (recorded / "_shards" / "part-00000.parquet.json").write_text(
        json.dumps({"file": "part-00000.parquet", "dataset_key": "k1", "dimension": 384})
    )
    (recorded / "notes.txt").write_text("the user's note in our dataset")
    check_dataset_dir(recorded, "k1", 384)
    with pytest.raises(ArtifactError, match="content key k1"):
        check_dataset_dir(recorded, "k2", 384)

    web = tmp_path / "web"  # a manifest.json that is not ours (no key) must not pass for a dataset
    web.mkdir()
    (web / "manifest.json").write_text(json.dumps({"name": "my app", "files": []}))
    with pytest.raises(ArtifactError, match=r"manifest\.json"):
        check_dataset_dir(web, "k1", 384)
    check_dataset_dir(tmp_path / "new", "k1", 384)  # absent: fine, and still absent
    assert not (tmp_path / "new").exists()


def test_an_unreadable_dataset_dir_is_named_not_a_traceback(tmp_path: Path, monkeypatch) -> None:
    """A dataset.dir the user may not list (another user's, mode 0311) is one error naming it: plan
    checks it now, and its PermissionError used to escape as a traceback."""
    from apps.dataset import layout
    from core.errors import ArtifactError

    def unreadable(directory: Path) -> None:
        raise PermissionError(13, "Permission denied", str(directory))

    monkeypatch.setattr(layout, "_existing_dataset", unreadable)  # root can list any directory
    (tmp_path / "theirs").mkdir()
    with pytest.raises(ArtifactError, match=r"dataset.dir .*theirs cannot be read: Permission denied"):
        layout.check_dataset_dir(tmp_path / "theirs", "k1", 384)


# --- errors inside Parsl tasks --------------------------------------------------------------------------


def test_dependency_errors_unwrap_to_the_task_error() -> None:
    """A chunk task's error reaches the user as itself, not as the DependencyError of a later stage."""
    from parsl.dataflow.errors import DependencyError

    from core.errors import InputDataError
    from pipeline.dag import root_cause

    cause = InputDataError("/data/c.jsonl:7: record 12 has no text")
    inner = DependencyError([(OSError("unrelated"), "task 3"), (cause, "task 4")], 5)
    outer = DependencyError([(inner, "task 5")], 9)
    assert root_cause(outer) is cause
    plain = ValueError("boom")
    assert root_cause(DependencyError([(plain, "task 1")], 2)) is plain
