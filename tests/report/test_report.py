"""results.parquet under a fixed schema, and report.md with study-shaped tables and real PNG figures."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apps.evaluate.results import RESULTS_SCHEMA, normalize_rows, read_results, results_table, write_results
from apps.report.document import write_report
from apps.report.figures import pareto_frontier
from apps.vdb.records import setting_label

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PROVENANCE = {
    "dataset_key": "ds-1a2b",
    "queries_key": "q-3c4d",
    "groundtruth_key": "gt-5e6f",
    "run_id": "run-7",
}


def query_row(db: str, ef: int, qps: float, recall: float, batch: int = 32, **extra: Any) -> dict[str, Any]:
    mean = 1000.0 * batch / qps
    return {
        "database": db,
        "stage": "query",
        "setting": setting_label(ef, batch, 1, 10),
        "ef": ef,
        "batch_size": batch,
        "clients": 1,
        "k": 10,
        "qps": qps,
        "latency_mean_ms": mean,
        "p50_ms": mean * 0.95,
        "p95_ms": mean * 1.4,
        "p99_ms": mean * 2.1,
        "recall": recall,
        "recall_min": recall - 0.2,
        "queries_sent": 500,
        "distinct_queries": 500,
        "requests": 16,
        "window_s": 10.0,
        **PROVENANCE,
        **extra,
    }


def study_rows() -> list[dict[str, Any]]:
    """Qdrant complete (an insert sweep), Milvus never reaching 0.95, Weaviate failing to deploy."""
    rows: list[dict[str, Any]] = [
        {"database": "qdrant", "stage": "deploy", "deploy_s": 0.4, "server_version": "qdrant-edge 0.9.1"},
        {"database": "milvus", "stage": "deploy", "deploy_s": 11.2, "server_version": "v2.3.5"},
        {
            "database": "weaviate",
            "stage": "deploy",
            "status": "failed",
            "error": (
                "weaviate-server not found | install Go and run `make weaviate`\nor set vdb.weaviate.binary"
            ),
        },
    ]
    for batch, clients, seconds in ((64, 1, 9.0), (256, 1, 5.0), (1024, 1, 4.0), (256, 2, 3.0)):
        rows.append(
            {
                "database": "qdrant",
                "stage": "insert",
                "setting": f"batch={batch},clients={clients}",
                "batch_size": batch,
                "clients": clients,
                "vectors": 10_000,
                "upload_s": seconds,
                "searchable_s": seconds + 0.5,
                **PROVENANCE,
            }
        )
    rows.append(
        {
            "database": "qdrant",
            "stage": "index",
            "setting": "batch=256,clients=2",
            "index_s": 12.5,
            "segments": 3,
            "disk_bytes": 95_000_000,
            "write_amplification": 2.47,
            "params": {"hnsw_m": 16, "ef_construction": 100, "deferred_indexing": True},
        }
    )
    rows += [query_row("qdrant", ef, q, r) for ef, q, r in ((16, 900.0, 0.81), (32, 700.0, 0.93))]
    rows += [query_row("qdrant", ef, q, r) for ef, q, r in ((64, 500.0, 0.97), (128, 300.0, 0.995))]
    rows.append(query_row("qdrant", 48, 400.0, 0.95, batch=64))  # qualifies, but slower: off the frontier
    rows.append(
        {
            "database": "milvus",
            "stage": "insert",
            "setting": "batch=256,clients=1",
            "batch_size": 256,
            "clients": 1,
            "vectors": 10_000,
            "upload_s": 6.0,
            "searchable_s": 8.0,
            "insert_vectors_per_s": 1666.7,
        }
    )
    rows.append(
        {"database": "milvus", "stage": "index", "status": "failed", "error": "index build timed out"}
    )
    rows += [query_row("milvus", ef, q, r) for ef, q, r in ((16, 1500.0, 0.70), (64, 800.0, 0.90))]
    rows.append(
        {"database": "milvus", "stage": "query", "setting": "ef=256", "status": "failed", "error": "OOM"}
    )
    return rows


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# ------------------------------------------------------------------------------------------- results.parquet


def test_results_schema_is_fixed_and_typed(tmp_path: Path) -> None:
    path = tmp_path / "results.parquet"
    written = write_results(study_rows(), path)
    assert written["rows"] == len(study_rows()) and written["bytes"] > 0 and len(written["sha256"]) == 64
    assert pq.read_schema(path).remove_metadata().equals(RESULTS_SCHEMA)
    table = pq.read_table(path)
    deploy = table.filter(pa.compute.equal(table.column("stage"), "deploy")).to_pylist()
    failed = next(r for r in deploy if r["database"] == "weaviate")
    assert failed["status"] == "failed" and failed["qps"] is None and failed["setting"] is None
    assert next(r for r in deploy if r["database"] == "qdrant")["status"] == "ok"
    index = next(r for r in read_results(path) if r["stage"] == "index" and r["database"] == "qdrant")
    assert index["params"] == '{"deferred_indexing": true, "ef_construction": 100, "hnsw_m": 16}'
    assert index["segments"] == 3 and index["recall"] is None

    # an empty run and a run of failures have exactly the same schema
    write_results([], tmp_path / "empty.parquet")
    write_results(study_rows()[2:3], tmp_path / "failed.parquet")
    for name in ("empty.parquet", "failed.parquet"):
        assert pq.read_schema(tmp_path / name).remove_metadata().equals(RESULTS_SCHEMA)
    assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0
    assert results_table(study_rows()).schema.equals(RESULTS_SCHEMA)


def test_results_reject_unknown_columns_and_stages() -> None:
    with pytest.raises(ValueError, match=r"unknown columns \['qsp'\]"):
        normalize_rows([{"database": "qdrant", "stage": "query", "qsp": 10.0}])
    with pytest.raises(ValueError, match="stage 'serve' is not one of"):
        normalize_rows([{"database": "qdrant", "stage": "serve"}])
    with pytest.raises(ValueError, match="no database"):
        normalize_rows([{"stage": "query"}])
    with pytest.raises(ValueError, match=r"segments=2\.5 is not an integer"):
        normalize_rows([{"database": "qdrant", "stage": "index", "segments": 2.5}])


# --------------------------------------------------------------------------------------------- report.md


def test_report_tables_best_marker_and_figures(tmp_path: Path) -> None:
    results = tmp_path / "results.parquet"
    write_results(study_rows(), results)
    out = write_report(results, tmp_path / "report", title="Loopback benchmark")
    text = out["report"].read_text()
    lines = text.splitlines()
    assert lines[0] == "# Loopback benchmark"
    for heading in ("## Summary (best QPS at recall ≥ 0.95)", "## Upload and index", "## Query sweep"):
        assert heading in lines
    assert (
        "| database | vectors | upload (s) | searchable after last insert (s) | insert (vectors/s) "
        "| index (s) |" in text
    )
    assert "| database | setting | ef | batch | clients | k | QPS | mean (ms) | P50 (ms) | P95 (ms) |" in text

    # exactly one best row: Qdrant ef=64 (the fastest at recall >= 0.95, not the faster ef=16/32)
    best = [line for line in lines if line.endswith("| **best** |")]
    assert len(best) == 1
    assert best[0].startswith("| qdrant | ef=64,batch=32,clients=1,k=10 | 64 |")
    assert "| **500.0** |" in best[0] and "| **0.970** |" in best[0]
    assert "| qdrant | ef=128,batch=32,clients=1,k=10 | 128 | 32 | 1 | 10 | 300.0 |" in text
    summary = lines[lines.index("## Summary (best QPS at recall ≥ 0.95)") + 2 :][:5]
    assert any(
        s.startswith("| qdrant | qdrant-edge 0.9.1 | **ef=64,batch=32,clients=1,k=10** | 0.970 |")
        for s in summary
    )
    assert any("milvus" in s and "none at recall ≥ 0.95 (highest recall: ef=64" in s for s in summary)
    header = lines[lines.index("## Summary (best QPS at recall ≥ 0.95)") + 2]
    assert header.endswith("| index (s) | deploy (s) |")
    deploy = {s.split("|")[1].strip(): s.rsplit("|", 2)[1].strip() for s in summary if s.startswith("| ")}
    assert (deploy["qdrant"], deploy["milvus"], deploy["weaviate"]) == ("0.40", "11.20", "—")  # deploy_s

    # failures are rows, not crashes; the reason stays on one line and cannot break the table
    weaviate = [line for line in lines if line.startswith("| weaviate |")]
    assert len(weaviate) == 3  # summary, upload/index, query sweep
    for line in weaviate:
        assert (
            "failed: deploy: weaviate-server not found \\| install Go and run `make weaviate` or set" in line
        )
    assert "failed: index: index build timed out" in text
    assert "| milvus | ef=256 | failed: query: OOM |" in text

    # upload / index columns from the insert row that fed the index (batch 256, 2 clients)
    assert "| qdrant | 10,000 | 3.00 | 3.50 | 3,333 | 12.50 | 3 | 90.6 MiB | 2.47× |" in text
    assert (
        "### Insert sweep" in text and "| qdrant | batch=64,clients=1 | 64 | 1 | — | 10,000 | 9.00 |" in text
    )
    for key, value in PROVENANCE.items():
        assert f"- {key}: `{value}`" in text

    # figures: embedded with relative links, real PNGs of the expected size, not blank
    # (two client counts in the insert rows: the study's insert-clients figure is drawn too)
    assert set(out["figures"]) == {"recall_qps", "insert_throughput", "latency", "study_insert_clients"}
    for name, path in out["figures"].items():
        if name.startswith("study_"):
            continue  # tests/report/test_report_study.py
        assert path.parent == tmp_path / "report" and f"]({name}.png)" in text
        assert png_size(path) == (770, 506)
        assert path.stat().st_size > 15_000, f"{name}.png looks empty ({path.stat().st_size} bytes)"


def test_report_survives_missing_pieces(tmp_path: Path) -> None:
    """Only a failed deploy: a report without figures, saying why, instead of a crash."""
    rows = study_rows()[2:3]
    out = write_report(rows, tmp_path / "r")
    text = out["report"].read_text()
    assert out["figures"] == {}
    assert not list((tmp_path / "r").glob("*.png"))
    assert text.count("failed: deploy: weaviate-server not found") == 3
    assert "_Recall versus QPS per database" in text and "not drawn, no data._" in text
    empty = write_report([], tmp_path / "empty")
    assert "databases: none" in empty["report"].read_text()


def test_report_without_any_setting_at_target_recall(tmp_path: Path) -> None:
    rows = [r for r in study_rows() if r["database"] == "milvus"]
    out = write_report(rows, tmp_path / "m")
    text = out["report"].read_text()
    assert "| **best** |" not in text
    assert (
        "| milvus | v2.3.5 | none at recall ≥ 0.95 (highest recall: ef=64,batch=32,clients=1,k=10) |" in text
    )
    # the latency figure falls back to the highest-recall setting and says so
    assert set(out["figures"]) == {"recall_qps", "insert_throughput", "latency"}


def test_pareto_frontier() -> None:
    points = [(0.80, 900.0), (0.93, 700.0), (0.90, 650.0), (0.97, 500.0), (0.97, 450.0), (0.995, 300.0)]
    assert pareto_frontier(points) == [(0.80, 900.0), (0.93, 700.0), (0.97, 500.0), (0.995, 300.0)]
    assert pareto_frontier([]) == []


def test_mixed_stages_are_results_rows_and_a_run_without_them_has_no_mixed_section(tmp_path: Path) -> None:
    """apps/report/mixed.py writes mixed and mixed_baseline rows; another stage name is still refused."""
    rows = normalize_rows(
        [{"database": "qdrant", "stage": s, "latency_p99_ms": 3.0} for s in ("mixed", "mixed_baseline")]
    )
    assert [(r["stage"], r["latency_p99_ms"]) for r in rows] == [("mixed", 3.0), ("mixed_baseline", 3.0)]
    with pytest.raises(ValueError, match="stage 'mixing' is not one of"):
        normalize_rows([{"database": "qdrant", "stage": "mixing", "qps": 10.0}])
    text = write_report(study_rows(), tmp_path / "r")["report"].read_text()
    assert "Mixed" not in text and "mixed" not in text


def test_insert_sweep_says_what_was_sent(tmp_path: Path) -> None:
    """Two configured batch sizes the database split into 512-point requests: the report states both."""
    rows = [
        {
            "database": "qdrant",
            "stage": "insert",
            "setting": setting_label(None, batch, 1, request_size=512),
            "batch_size": batch,
            "request_size": 512,
            "clients": 1,
            "vectors": 10_000,
            "upload_s": seconds,
            "searchable_s": 0.5,
        }
        for batch, seconds in ((1024, 4.0), (4096, 3.9))
    ]
    rows.append({**rows[0], "setting": setting_label(None, 256, 1), "batch_size": 256, "request_size": 256})
    out = write_report(rows, tmp_path / "r")
    text = out["report"].read_text()
    assert "| qdrant | batch=1024,sent=512,clients=1 | 1,024 (sent 512) | 1 |" in text
    assert "| qdrant | batch=4096,sent=512,clients=1 | 4,096 (sent 512) | 1 |" in text
    assert "| qdrant | batch=256,clients=1 | 256 | 1 |" in text
    assert png_size(out["figures"]["insert_throughput"]) == (770, 506)
