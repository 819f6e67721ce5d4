"""The report across engines: the engine / index / medium table, and figures that stay legible with many
points (legend beside the axes, one entry per point)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from apps.report.document import write_report
from apps.report.engines import engine_facts, engines_section
from apps.vdb.capabilities import storage_medium
from apps.vdb.records import setting_label

# (label, database, collection overrides, settings overrides)
POINTS = [
    ("qdrant-hnsw", "qdrant", {}, {"mode": "edge"}),
    ("qdrant-hnsw-disk", "qdrant", {"on_disk": True}, {"mode": "edge"}),
    ("milvus-ivf-sq8", "milvus", {"index_type": "ivf_flat", "quantization": "scalar"}, {}),
    ("milvus-ivf-pq", "milvus", {"index_type": "ivf_pq"}, {}),
    ("weaviate-hnsw-bq", "weaviate", {"quantization": "bq"}, {}),
    ("pgvector-ivfflat", "pgvector", {"index_type": "ivf_flat"}, {}),
    ("lancedb-ivf-hnsw-sq", "lancedb", {"index_type": "ivf_hnsw_sq"}, {"medium": "run_dir", "nprobes": 16}),
    ("faiss-ivf-pq", "faiss", {"index_type": "ivf_pq"}, {}),
]
COLLECTION = {
    "index_type": "hnsw",
    "quantization": "none",
    "on_disk": False,
    "hnsw_m": 16,
    "ef_construction": 128,
    "ivf_nlist": 64,
    "pq_m": 96,
    "pq_bits": 8,
}


def rows() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n, (label, database, collection, settings) in enumerate(POINTS):
        params = json.dumps(
            {"collection": {**COLLECTION, **collection}, "settings": {"name": database, **settings}}
        )
        common = {"database": database, "label": label, "repeat": 0, "run_id": "r1"}
        out.append({**common, "stage": "deploy", "deploy_s": 1.0, "params": params, "server_version": "v1"})
        out.append(
            {
                **common,
                "stage": "insert",
                "setting": "batch=1024,clients=1",
                "batch_size": 1024,
                "clients": 1,
                "vectors": 8600,
                "upload_s": 0.1 * (n + 1) ** 2,
            }
        )
        for i, ef in enumerate((8, 16, 48, 128)):
            qps = 10_000.0 / (n + 1) / (i + 1)
            out.append(
                {
                    **common,
                    "stage": "query",
                    "setting": setting_label(ef, 32, 1, 10),
                    "ef": ef,
                    "batch_size": 32,
                    "clients": 1,
                    "k": 10,
                    "qps": qps,
                    "latency_mean_ms": 32_000.0 / qps,
                    "p50_ms": 30_000.0 / qps,
                    "p95_ms": 50_000.0 / qps,
                    "p99_ms": 60_000.0 / qps,
                    "recall": 0.7 + 0.075 * i,
                    "queries_sent": 500,
                    "distinct_queries": 500,
                    "window_s": 2.0,
                }
            )
    return out


def test_medium_follows_each_database_declaration() -> None:
    hnsw = dict(COLLECTION)
    assert storage_medium("qdrant", hnsw, {"mode": "edge"}) == "memory"
    assert storage_medium("qdrant", {**hnsw, "on_disk": True}, {}) == "disk (on_disk)"
    assert storage_medium("pgvector", hnsw, {}) == "disk (files)"  # PostgreSQL files, whatever on_disk says
    assert (
        storage_medium("lancedb", {**hnsw, "index_type": "ivf_pq"}, {"medium": "ssd"}) == "disk (files, ssd)"
    )
    assert storage_medium("lancedb", {**hnsw, "index_type": "ivf_pq"}, {"medium": "memory"}).startswith(
        "memory"
    )
    assert storage_medium("milvus", {**hnsw, "index_type": "diskann"}, {}) == "disk (files)"
    assert storage_medium("faiss", {**hnsw, "on_disk": True}, {}) == "disk (on_disk)"
    assert storage_medium("weaviate", hnsw, {}) == "memory"


def test_engines_table_names_index_quantisation_knob_and_medium() -> None:
    facts = engine_facts(rows())
    assert sorted(facts) == sorted(p[0] for p in POINTS)
    assert facts["qdrant-hnsw"]["engine"] == "qdrant (edge)" and facts["qdrant-hnsw"]["medium"] == "memory"
    assert facts["qdrant-hnsw-disk"]["medium"] == "disk (on_disk)"
    assert facts["milvus-ivf-sq8"]["quantization"] == "scalar (int8)"
    assert facts["milvus-ivf-sq8"]["knob"] == "nprobe" and facts["milvus-ivf-sq8"]["parameters"] == "nlist=64"
    assert facts["milvus-ivf-pq"]["parameters"] == "nlist=64, pq_m=96×8 bits"
    assert facts["weaviate-hnsw-bq"]["quantization"] == "binary (BQ)"
    assert facts["pgvector-ivfflat"]["medium"] == "disk (files)"
    lance = facts["lancedb-ivf-hnsw-sq"]
    assert lance["knob"] == "ef" and "nprobes=16" in lance["parameters"]
    assert lance["medium"] == "disk (files, run_dir)"
    lines = engines_section(rows())
    assert lines[0] == "## Engines, index types and media"
    assert sum(line.startswith("| ") for line in lines) == len(POINTS) + 1  # header + one row a point
    assert engines_section([{"database": "qdrant", "stage": "deploy", "params": None}]) == []


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    return struct.unpack(">II", data[16:24])


def test_report_across_engines_lists_them_and_widens_its_figures(tmp_path: Path) -> None:
    out = write_report(rows(), tmp_path, title="engines")
    text = out["report"].read_text()
    engines = text.index("## Engines, index types and media")
    assert engines < text.index("## Summary")
    for label, *_ in POINTS:
        assert f"| {label} |" in text
    # eight points: the legend goes beside the axes (a wider figure), one entry per point
    width, _ = png_size(out["figures"]["recall_qps"])
    assert width > 1000, width
    few = write_report([r for r in rows() if r["label"] in ("qdrant-hnsw", "faiss-ivf-pq")], tmp_path / "few")
    assert png_size(few["figures"]["recall_qps"])[0] < 800
