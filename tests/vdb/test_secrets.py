"""The per-deployment secrets of the database servers (apps/vdb/secret.py): files, reading, the HPC start
script."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from apps.vdb.base import DatabaseError, Endpoint
from apps.vdb.secret import endpoint_secret, new_secret, read_secret, start_script


def test_new_secret_is_random_private_and_replaces_the_old_one(tmp_path: Path) -> None:
    path = new_secret(tmp_path / "dir" / "key")
    first = read_secret(path, "test: the key file")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(first) == 48
    assert read_secret(new_secret(path), "test: the key file") != first


def test_read_secret_refuses_links_and_empty_files(tmp_path: Path) -> None:
    target = new_secret(tmp_path / "key")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(DatabaseError, match=r"test: the key file .*link cannot be read"):
        read_secret(tmp_path / "link", "test: the key file")
    os.link(target, tmp_path / "hard")
    with pytest.raises(DatabaseError, match="not a plain file"):
        read_secret(target, "test: the key file")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(DatabaseError, match="is empty"):
        read_secret(tmp_path / "empty", "test: the key file")


def test_endpoint_secret_reads_the_file_the_endpoint_names(tmp_path: Path) -> None:
    path = new_secret(tmp_path / "key")
    node = Endpoint(host="h", port=1, extra={"api_key_file": str(path)})
    assert endpoint_secret(node, "api_key_file", "x") == path.read_text().strip()
    assert endpoint_secret(Endpoint(host="h", port=1), "api_key_file", "x") is None
    assert endpoint_secret(None, "api_key_file", "x") is None


def test_start_script_makes_the_secret_once_and_exports_it_to_the_server(tmp_path: Path) -> None:
    script = tmp_path / "start.sh"
    script.write_text(start_script("test", "TEST_SECRET", "secret"))
    run = tmp_path / "run"
    run.mkdir()
    server = ["/bin/sh", "-c", 'printf %s "$TEST_SECRET"']  # stands in for the server: prints what it got

    def start() -> str:
        done = subprocess.run(["/bin/sh", str(script), str(run), *server], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    first = start()
    secret_file = run / "secret"
    assert first == secret_file.read_text() and len(first) == 48 and int(first, 16) >= 0
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert start() == first  # a restart (a requeued job) keeps the secret its clients read
    assert first not in script.read_text()
