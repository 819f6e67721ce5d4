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
