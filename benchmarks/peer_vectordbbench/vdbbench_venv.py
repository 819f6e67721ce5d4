"""VectorDBBench in a virtual environment of its own under ``benchmarks/out/`` (gitignored), made once.

The directory is named by a hash of :data:`PINS` and :data:`PATCH`, so a changed pin makes a new one and a
later run reuses a complete one (``.ready`` is written last). What it holds and why:

* ``vectordb-bench==2.0.0``: the peer;
* ``weaviate-client==3.26.7``: its Weaviate code is written against the v3 client (``weaviate.Client``,
  ``client.schema``, ``client.query.get``), which 4.x removed; its ``weaviate`` extra does not pin it;
* ``pymilvus==2.6.17``: within what vectordb-bench 2.0 requires (>= 2.6.15, < 3).

:data:`PATCH`: a Milvus 2.3.5 server (the project's) leaves ``primary_field_name`` empty in search results,
and every pymilvus then keys each hit's primary key ``"id"``; VectorDBBench reads ``hit["pk"]``, gets a
KeyError, and its concurrent phase counts no query yet reports success with 0 QPS. No pymilvus release
reads it otherwise, so the one default in ``pymilvus/client/search_result.py`` becomes ``"pk"`` (what a
newer server names VectorDBBench's primary key); nothing else in VectorDBBench or pymilvus is changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import common

PINS = ("vectordb-bench==2.0.0", "weaviate-client==3.26.7", "pymilvus==2.6.17")
PATCH = {
    "file": "pymilvus/client/search_result.py",
    "old": 'res.primary_field_name or "id"',
    "new": 'res.primary_field_name or "pk"',
}
IMPORTS = (
    "vectordb_bench.backend.assembler",
    "vectordb_bench.backend.clients.milvus.milvus",
    "vectordb_bench.backend.clients.weaviate_cloud.weaviate_cloud",
)


def venv_dir() -> Path:
    """``benchmarks/out/vdbbench-venv-<hash of the pins and the patch>``."""
    key = hashlib.sha256(json.dumps([PINS, PATCH, sys.version_info[:2]]).encode()).hexdigest()[:12]
    return common.OUT / f"vdbbench-venv-{key}"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def vdbbench_env(work: Path) -> dict[str, str]:
    """VectorDBBench reads its log, result and dataset directories from the environment when imported (its
    defaults: ./logs and /tmp); run it in ``work`` so it reads no ``.env`` of the caller's directory."""
    env = dict(os.environ)
    env.update(
        LOG_FILE=str(work / "logs" / "vectordb_bench.log"),
        LOG_LEVEL="INFO",
        RESULTS_LOCAL_DIR=str(work / "results"),
        DATASET_LOCAL_DIR=str(work / "dataset"),
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    return env


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    env = vdbbench_env(cwd) if cwd else None
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
        raise SystemExit(
            f"VectorDBBench venv: {what} failed (exit {done.returncode}):\n  " + "\n  ".join(tail)
        )
    return done.stdout


def _patch(venv: Path) -> Path:
    """Apply :data:`PATCH` to the venv's pymilvus; refuse a file that does not hold the line exactly once."""
    site = Path(
        _run(
            [str(python_of(venv)), "-c", "import pymilvus, os; print(os.path.dirname(pymilvus.__path__[0]))"],
            "locating pymilvus",
        ).strip()
    )
    path = site / PATCH["file"]
    text = path.read_text()
    if text.count(PATCH["old"]) != 1:
        raise SystemExit(f"{path}: expected {PATCH['old']!r} once, found {text.count(PATCH['old'])} times")
    path.write_text(text.replace(PATCH["old"], PATCH["new"]))
    for cache in path.parent.glob("__pycache__/search_result.*.pyc"):
        cache.unlink()
    return path


def ensure(log=print) -> Path:
    """The venv's python; creates, installs and patches the venv first when it is not complete."""
    venv = venv_dir()
    if (venv / ".ready").exists():
        return python_of(venv)
    if venv.exists():  # an interrupted install: start over
        shutil.rmtree(venv)
    base = getattr(sys, "_base_executable", None) or sys.executable
    log(f"installing VectorDBBench into {venv.relative_to(common.REPO)} ({', '.join(PINS)}; once, ~2 min)")
    _run([base, "-m", "venv", str(venv)], "python -m venv")
    pip = [str(python_of(venv)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, *PINS], "pip install")
    patched = _patch(venv)
    check = venv / "import-check"
    check.mkdir()
    _run(
        [str(python_of(venv)), "-c", "; ".join(f"import {m}" for m in IMPORTS)],
        "importing VectorDBBench",
        check,
    )
    (venv / ".ready").write_text(json.dumps({"pins": PINS, "patched": str(patched)}) + "\n")
    return python_of(venv)


def freeze(python: Path) -> list[str]:
    """``pip freeze`` of the venv (for the JSON output)."""
    return _run([str(python), "-m", "pip", "freeze", "--disable-pip-version-check"], "pip freeze").split()
