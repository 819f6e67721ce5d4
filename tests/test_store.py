"""The store's atomic writes (core/store.py): whole or absent, and readable by whom the umask allows."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from core.store import atomic_write_json, atomic_write_text, write_parquet_atomic


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_take_the_umask_not_a_private_mode(tmp_path: Path, umask: int) -> None:
    """Datasets, manifests and reports on a project file system are read by the project's other members:
    a temp file's 0o600 must not survive the rename (it did, for every file the store wrote)."""
    before = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "README.md", "card\n")
        atomic_write_json(tmp_path / "manifest.json", {"rows": 1})
        write_parquet_atomic(pa.table({"id": [1, 2]}), tmp_path / "part-00000.parquet")
    finally:
        os.umask(before)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == dict.fromkeys(["README.md", "manifest.json", "part-00000.parquet"], 0o666 & ~umask)


@pytest.mark.parametrize(
    ("content", "why"),
    [(b'{"rows": 1', "not valid JSON at line 1"), (b"\xff\xfe", "not UTF-8 text"), (b"[1]", "a JSON list")],
)
def test_a_damaged_manifest_is_named_with_the_remedy(tmp_path: Path, content: bytes, why: str) -> None:
    """A manifest cut short or overwritten is an ArtifactError naming the file, not a JSONDecodeError
    that names none (plan and status ended in a traceback); an absent one is simply incomplete."""
    from core.errors import ArtifactError
    from core.store import read_manifest

    assert read_manifest(tmp_path) is None
    (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(ArtifactError) as error:
        read_manifest(tmp_path)
    assert str(error.value) == (
        f"{tmp_path / 'manifest.json'}: damaged manifest ({why}"
        + (", not an object" if why == "a JSON list" else "")
        + "); delete it and run again to have the stage redone"
    )


def test_shard_progress_counts_only_shards_that_verify(tmp_path: Path) -> None:
    """A finished shard whose file was cut short, removed, or whose record is garbage is not 'done':
    it is named, and a run makes it again."""
    from core.store import shard_progress, write_shard_record

    for index in range(4):
        name = f"part-{index:05d}.parquet"
        written = write_parquet_atomic(pa.table({"id": list(range(100))}), tmp_path / name)
        write_shard_record(tmp_path, {"file": name, **written})
    assert shard_progress(tmp_path) == (4, [])
    size = (tmp_path / "part-00001.parquet").stat().st_size
    os.truncate(tmp_path / "part-00001.parquet", size // 2)
    (tmp_path / "part-00002.parquet").unlink()
    (tmp_path / "_shards" / "part-00003.parquet.json").write_text("{")
    done, damaged = shard_progress(tmp_path)
    assert done == 1
    assert damaged == [
        f"{tmp_path / 'part-00001.parquet'}: {size // 2} bytes, manifest says {size}",
        f"{tmp_path / 'part-00002.parquet'}: missing",
        f"{tmp_path / '_shards' / 'part-00003.parquet.json'}: damaged record",
    ]


def test_a_part_overwritten_in_place_fails_its_read_naming_it(tmp_path: Path) -> None:
    """Same size, so taken as complete; zstd stores float vectors raw, so without the page CRCs the
    damage read as other numbers. With them the read fails, naming the file."""
    import numpy as np
    import pyarrow.parquet as pq

    from core.errors import ArtifactError
    from core.store import naming_damage, open_parquet

    path = tmp_path / "part-00000.parquet"
    vectors = np.random.default_rng(0).random((2000, 64), dtype=np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 64)
    write_parquet_atomic(pa.table({"embedding": column}), path)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    with open(path, "r+b") as fh:
        fh.seek(chunk.data_page_offset + chunk.total_compressed_size // 2)
        fh.write(b"\xff" * 64)
    assert pq.ParquetFile(path).read().num_rows == 2000  # unchecked, the damage reads as numbers
    with pytest.raises(ArtifactError) as error, naming_damage(path):
        open_parquet(path).read()
    assert str(error.value).startswith(f"{path}: cannot be read (OSError: could not verify page integrity")
    assert str(error.value).endswith("delete it and run again to have it made again")
    path.unlink()  # removed after the plan found it: said so, not "if it was damaged"
    with pytest.raises(ArtifactError) as error, naming_damage(path):
        open_parquet(path).read()
    assert str(error.value) == f"{path}: missing (removed during the run?); run again to have it made again"


def test_manifest_entries_of_the_wrong_type_are_named_not_a_traceback(tmp_path: Path) -> None:
    """Valid JSON of the wrong shape ended plan and status in KeyError / TypeError tracebacks."""
    from core.errors import ArtifactError
    from core.store import complete_manifest, read_manifest, shard_progress, verify_files

    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"files": 7}')
    with pytest.raises(ArtifactError, match=r"damaged manifest \('files' is not a list\)"):
        read_manifest(tmp_path)
    manifest.write_text('{"files": [{"file": "a.parquet"}, {"file": null, "bytes": 3}, "x"]}')
    assert complete_manifest(tmp_path) is None
    assert verify_files(tmp_path, read_manifest(tmp_path)["files"]) == [
        f"{manifest}: files[{n}] is not a {{file, bytes}} entry" for n in range(3)
    ]
    manifest.unlink()
    manifest.mkdir()  # a folder in its place: named, as a file another user cannot read would be
    with pytest.raises(ArtifactError, match=r"manifest.json: cannot be read \(Is a directory\)"):
        read_manifest(tmp_path)
    (tmp_path / "_shards").mkdir()
    (tmp_path / "_shards" / "part-00000.parquet.json").write_text('{"file": ["x"], "bytes": 1}')
    assert shard_progress(tmp_path) == (
        0,
        [f"{tmp_path / '_shards' / 'part-00000.parquet.json'}: damaged record"],
    )


def test_an_os_error_reads_file_and_reason_in_every_command() -> None:
    """One wording for every command's OSError line: the file and the reason, no ``[Errno 2]``."""
    from core.errors import os_message

    missing = FileNotFoundError(2, "No such file or directory", "/w/runs/x/provenance.json")
    assert str(missing).startswith("[Errno 2]")
    assert os_message(missing) == "/w/runs/x/provenance.json: No such file or directory"
    assert os_message(OSError("quota exceeded")) == "quota exceeded"
