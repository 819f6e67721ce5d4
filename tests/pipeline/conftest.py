"""One real small run shared by the console tests and the run-record tests (about 30 s to make)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import base_config, run_cli, sample_records, write_jsonl

QDRANT = {
    "name": "qdrant",
    "mode": "edge",
    "indexing_threshold_kb": 1,
    "full_scan_threshold_kb": 1,
    "default_segment_number": [1, 2],
}
LABELS = ("qdrant[default_segment_number=1]", "qdrant[default_segment_number=2]")
VDB = {
    "databases": [QDRANT],
    "collection": {"index_type": "hnsw", "hnsw_m": 16, "ef_construction": 64},
    "insert": {"batch_sizes": [64], "clients_per_worker": 1},
    "query": {
        "ef": [16, 64],
        "batch_size": [8],
        "clients": [1],
        "k": [10],
        "warmup_queries": 2,
        "max_queries": 10,
        "duration_s": 0.2,
    },
}


@pytest.fixture(scope="session")
def small_run(tmp_path_factory) -> dict[str, Any]:
    """One finished run of two sweep points (Qdrant's embedded engine): its stdout, run directory, report
    directory, workdir and config. Tests may copy it, rewrite its report and start other runs in its
    workdir, but leave its own files as they found them."""
    root = tmp_path_factory.mktemp("small-run")
    corpus = write_jsonl(root / "c.jsonl", sample_records(40))
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(base_config(corpus, root / "wd", vdb=VDB)))
    result = run_cli("run", str(path))
    assert result.returncode == 0, result.stderr[-4000:]
    (run_dir,) = [p for p in (root / "wd" / "runs").iterdir() if (p / "provenance.json").is_file()]
    prov = json.loads((run_dir / "provenance.json").read_text())
    return {
        "stdout": result.stdout,
        "stderr": result.stderr,
        "run_dir": run_dir,
        "report": Path(prov["stages"]["vdb"]["directory"]) / "report",
        "workdir": root / "wd",
        "config": path,
    }
