"""Typed records between the vector-database stages, with Qdrant's embedded engine (fast, in-process):
the configured insert batch is the batch sent (split into requests only where a client caps them, and
recorded), deploy time is measured, manifests round-trip, one setting label."""

from __future__ import annotations

import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pytest

from apps.dataset.layout import finalize_dataset, vectors_to_arrow
from apps.vdb.base import CollectionSpec, DatabaseError, Endpoints
from apps.vdb.qdrant.deploy import QdrantDeployment
from apps.vdb.qdrant.edge import EdgeClient
from apps.vdb.qdrant.settings import QdrantSettings
from apps.vdb.records import (
    DatabaseOutcome,
    DatabaseTarget,
    IndexRecord,
    QueryRecord,
    setting_label,
)
from apps.vdb.stages.insert import insert_partition, prepare_collection, wait_searchable, work_units
from core.store import atomic_write_json, atomic_write_text, write_parquet_atomic
from pipeline.report_stage import database_rows
from pipeline.vdb_stages import deploy, insert_record, read_outcome

SETTINGS = QdrantSettings(name="qdrant", mode="edge", indexing_threshold_kb=1, full_scan_threshold_kb=1)
SPEC = CollectionSpec(name="records", dim=8, metric="l2", index_type="hnsw")


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """100 vectors of dimension 8 in one part of two row groups of 50."""
    directory = tmp_path / "dataset"
    ids = np.arange(100, dtype=np.int64)
    vectors = np.random.default_rng(7).random((100, 8), dtype=np.float32)
    table = pa.table(
        {
            "id": ids,
            "doc_id": ids.astype(str),
            "chunk_index": np.zeros(100, np.int32),
            "embedding": vectors_to_arrow(vectors, "float32"),
        }
    )
    name = "part-00000.parquet"
    written = write_parquet_atomic(table, directory / name, row_group_rows=50)
    finalize_dataset(str(directory), "records", [{"file": name, "shard": 0, **written}], {"dimension": 8}, {})
    return directory


class SlowStart(QdrantDeployment):
    """The embedded engine, 0.3 s slower to become healthy (so the measured time has a known floor)."""

    def start(self, workdir: Path, timeout: float = 120.0) -> Endpoints:
        time.sleep(0.3)
        return super().start(workdir, timeout)


@pytest.fixture
def target(tmp_path: Path):
    deployment = SlowStart(SETTINGS)
    try:
        deployed = deploy(deployment, str(tmp_path / "server"), 60)
        yield DatabaseTarget(settings=SETTINGS, endpoints=deployed.endpoints, collection=SPEC), deployed
    finally:
        deployment.stop()


def test_deploy_time_is_measured_and_reaches_the_results(target) -> None:
    _target, deployed = target
    assert 0.3 <= deployed.deploy_s < 60
    outcome = DatabaseOutcome(
        database="qdrant", status="succeeded", settings=SETTINGS, collection=SPEC, deploy_s=deployed.deploy_s
    )
    deploy_row = next(r for r in database_rows(outcome) if r["stage"] == "deploy")
    assert deploy_row["deploy_s"] == deployed.deploy_s


class CappedEdge(EdgeClient):
    """The embedded engine's client with a maximum request size below the configured batch."""

    max_request_size = 16
    sent: ClassVar[list[int]] = []  # request sizes, across instances

    def insert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids) > self.max_request_size:
            raise AssertionError(f"{len(ids)} points in one request; the maximum is {self.max_request_size}")
        CappedEdge.sent.append(len(ids))
        super().insert(ids, vectors)


def test_an_in_process_upload_is_searchable_when_its_last_request_was_counted(target, dataset) -> None:
    target, _ = target
    prepare_collection(target, False)
    part = insert_partition(target, work_units(str(dataset)), 40, 2, 0)
    assert part.visible_at is not None and part.last_end <= part.visible_at
    visible = wait_searchable(target, 100, 60, part)
    assert (visible.searchable_at, visible.count) == (part.visible_at, 100)
    with pytest.raises(DatabaseError, match="1 of 101 rows missing after upload"):
        wait_searchable(target, 101, 60, part.model_copy(update={"rows": 101}))


def test_batches_above_the_request_maximum_are_split_and_recorded(target, dataset, monkeypatch) -> None:
    target, _ = target
    units = work_units(str(dataset))
    prepare_collection(target, False)
    uncapped = insert_partition(target, units, 40, 1, 0)
    assert (uncapped.request_size, uncapped.batches, uncapped.rows) == (40, 4, 100)

    monkeypatch.setattr(
        DatabaseTarget, "open_client", lambda self, client_index=0: CappedEdge(self.settings, self.endpoints)
    )
    CappedEdge.sent.clear()
    prepare_collection(target, True)
    part = insert_partition(target, units, 40, 1, 0)
    # each row group of 50: batches of 40 + 10, the batch of 40 sent as 16 + 16 + 8
    assert CappedEdge.sent == [16, 16, 8, 10] * 2
    assert (part.request_size, part.batches, part.rows) == (16, 4, 100)
    visible = wait_searchable(target, 100, 60, part)
    record = insert_record(part, visible, batch_size=40, workers=1)
    assert (record.batch_size, record.request_size) == (40, 16)
    assert record.setting == "batch=40,sent=16,clients=1"
    row = next(r for r in database_rows(_outcome(insert=[record])) if r["stage"] == "insert")
    assert (row["batch_size"], row["request_size"], row["setting"]) == (40, 16, "batch=40,sent=16,clients=1")


def _outcome(**fields) -> DatabaseOutcome:
    return DatabaseOutcome(
        database="qdrant", status="succeeded", settings=SETTINGS, collection=SPEC, deploy_s=0.5, **fields
    )


def test_manifest_round_trips_and_an_old_layout_is_run_again(tmp_path: Path) -> None:
    outcome = _outcome(
        server_version="qdrant-edge",
        index=IndexRecord(index_s=1.0, count=100, segments=2, disk_bytes=4096, write_amplification=1.28),
        queries=[QueryRecord(setting=setting_label(16, 1, 1, 10), file=str(tmp_path / "raw.parquet"))],
    )
    atomic_write_text(tmp_path / "qdrant" / "manifest.json", outcome.model_dump_json(indent=2))
    assert read_outcome(tmp_path / "qdrant") == outcome
    old = {**outcome.model_dump(mode="json"), "send_s": 1.0}  # a field of an earlier layout
    atomic_write_json(tmp_path / "old" / "manifest.json", old)
    assert read_outcome(tmp_path / "old") is None
    assert read_outcome(tmp_path / "never") is None
    assert read_outcome(tmp_path / "qdrant", key="another point") is None
    (tmp_path / "cut" / "manifest.json").parent.mkdir()
    (tmp_path / "cut" / "manifest.json").write_text(outcome.model_dump_json()[:40])  # damaged: measured again
    assert read_outcome(tmp_path / "cut") is None


def test_one_setting_label_for_queries_and_inserts() -> None:
    assert setting_label(64, 32, 2, 10) == "ef=64,batch=32,clients=2,k=10"
    assert setting_label(None, 1, 4, 10) == "ef=none,batch=1,clients=4,k=10"
    assert setting_label(None, 1024, 2) == "batch=1024,clients=2"
    assert setting_label(None, 1024, 2, request_size=1024) == "batch=1024,clients=2"
    assert setting_label(None, 1024, 2, request_size=512) == "batch=1024,sent=512,clients=2"
