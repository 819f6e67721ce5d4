"""VectorDBBench's side of ``benchmarks.peer_vectordbbench``: run by path inside VectorDBBench's own virtual
environment (``vdbbench_venv.py``), never in the project's. It imports nothing of the project.

    <venv>/bin/python benchmarks/peer_vectordbbench/vdbbench_driver.py spec.json result.json

It builds the ``TaskConfig`` that ``vectordbbench milvushnsw|weaviate --case-type PerformanceCustomDataset
--skip-drop-old --skip-load --search-serial --search-concurrent`` builds, assembles it with VectorDBBench's
``Assembler`` and runs its ``CaseRunner`` (what the CLI's task process does, minus the result file):
concurrent search for ``duration`` s at each concurrency, then the serial pass over the test set (recall,
serial p99). Its log lines give the query counts and seconds behind each QPS. Afterwards the same client
object's ``search_embedding`` is called once per test query, and those ids are written out so the caller
can recompute recall independently.

A server the project started requires its secret (Milvus: root's password; Weaviate: the API key): the
spec names the 0600 file that holds it (``password_file``, ``api_key_file``), never the secret itself, and
the driver reads it here into VectorDBBench's ``SecretStr`` fields.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

CONC_LINE = re.compile(r"End search in concurrency (\d+): dur=([\d.]+)s, total_count=(\d+), qps=([\d.]+)")


class Captured(logging.Handler):
    """Keeps VectorDBBench's log messages (this process's) to read the counts behind its figures."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def read_secret(spec: dict[str, Any], key: str) -> str | None:
    """The secret in the file ``spec[key]`` names (opened without following a link); None when the spec
    names none (a server started without one)."""
    if not spec.get(key):
        return None
    with os.fdopen(os.open(spec[key], os.O_RDONLY | os.O_NOFOLLOW)) as handle:
        value = handle.read().strip()
    if not value:
        raise SystemExit(f"{spec['database']}: {spec[key]} is empty")
    return value


def task_config(spec: dict[str, Any]) -> Any:
    """The TaskConfig the CLI builds for a search-only PerformanceCustomDataset case."""
    from pydantic import SecretStr
    from vectordb_bench.backend.clients import DB
    from vectordb_bench.models import CaseConfig, CaseType, ConcurrencySearchConfig, TaskConfig, TaskStage

    if spec["database"] == "milvus":
        from vectordb_bench.backend.clients.milvus.config import HNSWConfig, MilvusConfig

        db = DB.Milvus
        password = read_secret(spec, "password_file")
        auth = {"user": "root", "password": SecretStr(password)} if password else {}
        db_config = MilvusConfig(uri=SecretStr(spec["uri"]), collection_name=spec["collection"], **auth)
        case_config = HNSWConfig(M=spec["m"], efConstruction=spec["ef_construction"], ef=spec["ef"])
    elif spec["database"] == "weaviate":
        from vectordb_bench.backend.clients.weaviate_cloud.config import WeaviateConfig, WeaviateIndexConfig

        db = DB.WeaviateCloud
        key = read_secret(spec, "api_key_file")  # sent as "Authorization: Bearer" (weaviate.AuthApiKey)
        db_config = WeaviateConfig(url=SecretStr(spec["uri"]), api_key=SecretStr(key or "-"), no_auth=not key)
        case_config = WeaviateIndexConfig(
            ef=spec["ef"], efConstruction=spec["ef_construction"], maxConnections=spec["m"]
        )
    else:
        raise SystemExit(f"unknown database {spec['database']!r}")
    dataset = spec["dataset"]
    custom_case = {
        "name": "project dataset (search only)",
        "description": "configs/local.yaml dataset exported by benchmarks.peer_vectordbbench",
        "load_timeout": 36000,
        "optimize_timeout": 36000,
        "dataset_config": {
            "name": "project",
            "dir": dataset["dir"],
            "size": dataset["size"],
            "dim": dataset["dim"],
            "metric_type": dataset["metric_type"],
            "file_count": 1,
            "use_shuffled": False,
            "with_gt": True,
        },
    }
    return TaskConfig(
        db=db,
        db_config=db_config,
        db_case_config=case_config,
        case_config=CaseConfig(
            case_id=CaseType.PerformanceCustomDataset,
            k=spec["k"],
            concurrency_search_config=ConcurrencySearchConfig(
                concurrency_duration=spec["duration"],
                num_concurrency=spec["concurrencies"],
                concurrency_timeout=3600,
                serial_cooldown=0,
            ),
            custom_case=custom_case,
        ),
        stages=[TaskStage.SEARCH_SERIAL, TaskStage.SEARCH_CONCURRENT],
    )


def returned_ids(runner: Any, k: int) -> list[list[int]]:
    """Every test query once through the case's own client object and ``search_embedding``."""
    db = runner.db
    with db.init():
        db.prepare_filter(runner.ca.filters)
        return [[int(i) for i in db.search_embedding(q, k)] for q in runner.test_emb]


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    from importlib.metadata import version

    from vectordb_bench.backend.assembler import Assembler
    from vectordb_bench.backend.data_source import DatasetSource

    captured = Captured()
    logging.getLogger("vectordb_bench").addHandler(captured)
    task = task_config(spec)
    runner = Assembler.assemble(f"peer-{int(time.time())}", task, DatasetSource.S3)
    started = time.time()
    metric = runner.run(drop_old=False)
    case_s = time.time() - started
    concurrent = {
        int(m.group(1)): {"seconds": float(m.group(2)), "queries": int(m.group(3)), "qps": float(m.group(4))}
        for line in captured.lines
        if (m := CONC_LINE.search(line))
    }
    ids = returned_ids(runner, spec["k"])
    result = {
        "vectordb_bench": version("vectordb-bench"),
        "metric": asdict(metric),
        "concurrent": {str(c): v for c, v in concurrent.items()},
        "serial_queries": len(runner.test_emb),
        "case_s": case_s,
        "ids": ids,
        "log_tail": captured.lines[-40:],
    }
    Path(sys.argv[2]).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
