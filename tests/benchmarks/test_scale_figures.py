"""``benchmarks.scale``'s arithmetic: the median of a size's repeats; which insert rate a target reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.scale.__main__ import (
    TARGETS,
    against_peer,
    anchored_rows,
    cost_table,
    insert_summary,
    matrix_entries,
    median_figures,
    repeats_for,
    scale_config,
    upload_figures,
)


def test_a_size_reports_the_median_of_its_repeats_and_keeps_each_one() -> None:
    repeats = [
        {"upload_s": 1.9, "insert_vectors_per_s": 52_000.0, "index_s": 35.7, "drain_s": None},
        {"upload_s": 1.7, "insert_vectors_per_s": 58_900.0, "index_s": 32.0, "drain_s": None},
        {"upload_s": 1.73, "insert_vectors_per_s": 57_800.0, "index_s": 32.1},
    ]
    figures = median_figures(repeats)
    assert figures["upload_s"] == 1.73 and figures["insert_vectors_per_s"] == 57_800.0
    assert figures["index_s"] == 32.1
    assert figures["drain_s"] is None  # nothing measured: no figure, not zero
    assert figures["repeats"] == repeats


def test_insert_figures_are_the_median_over_every_upload_of_every_repeat() -> None:
    """A million-row size has one point: its insert rate rests on that point's uploads, not on one."""

    def upload(seconds: float, drain: float) -> dict:
        row = {"upload_s": seconds, "searchable_s": drain, "vectors": 100_000}
        return upload_figures({**row, "insert_vectors_per_s": 100_000 / seconds})

    repeats = [
        {"uploads": [upload(2.0, 0.0), upload(1.6, 0.1)], "index_s": 30.0},
        {"uploads": [upload(1.7, 0.0), upload(1.8, 0.5), upload(3.0, 0.0)], "index_s": 40.0},
    ]
    figures = median_figures(repeats)
    assert figures["upload_s"] == 1.8 and figures["uploads"] == 5
    assert figures["insert_vectors_per_s"] == 100_000 / 1.8
    assert figures["drain_s"] == 0.0
    assert figures["acked_vectors_per_s"] == round(100_000 / 1.7, 1)  # sent in 2.0, 1.5, 1.7, 1.3, 3.0 s
    assert figures["index_s"] == 35.0  # per point: the median of the two repeats


def test_each_point_uploads_several_times_but_an_engine_building_while_it_uploads_once(
    tmp_path: Path,
) -> None:
    import yaml

    entries = [{"name": "qdrant", "mode": "edge"}, {"name": "weaviate"}]
    path = scale_config(tmp_path, tmp_path / "dataset", 1_000_000, entries, repeats=1, uploads=3)
    databases = yaml.safe_load(path.read_text())["vdb"]["databases"]
    assert databases[0]["insert"] == {"batch_sizes": [1000, 1000, 1000]}
    assert "insert" not in databases[1]  # its upload includes the graph build: 28 min at 1M
    single = scale_config(tmp_path, tmp_path / "dataset", 1_000_000, entries, uploads=1)
    assert all("insert" not in d for d in yaml.safe_load(single.read_text())["vdb"]["databases"])


def test_repeats_default_to_three_below_a_million_rows_and_an_explicit_count_wins() -> None:
    assert [repeats_for(n, None) for n in (10_000, 100_000, 1_000_000)] == [3, 3, 1]
    assert repeats_for(1_000_000, 2) == 2


def test_an_engine_that_builds_while_it_uploads_is_judged_on_its_acknowledged_rate() -> None:
    """Weaviate's rate to searchable includes its HNSW build (the queue's drain); Qdrant's does not."""
    growth = {
        "qdrant.insert_rate_ratio": 0.69,
        "qdrant.acked_rate_ratio": 0.70,
        "weaviate.insert_rate_ratio": 0.46,
        "weaviate.acked_rate_ratio": 0.85,
        "faiss.insert_rate_ratio": None,  # a size without the figure: no row
        "driver_rss_ratio": 1.04,
    }
    rows = {row["database"]: row for row in insert_summary(growth)}
    assert set(rows) == {"qdrant", "weaviate"}
    assert rows["qdrant"] == {"database": "qdrant", "ratio": 0.69, "rate": "to searchable", "met": False}
    assert rows["weaviate"]["rate"] == "acknowledged" and rows["weaviate"]["ratio"] == 0.85
    assert rows["weaviate"]["met"] is (TARGETS["insert_rate_ratio"] <= 0.85)


def _size(rows: int, engines: dict[str, dict]) -> dict:
    return {"rows": rows, "engines": engines}


def test_the_matrix_gives_one_costs_row_per_index_and_quantisation_beside_its_hnsw_peer() -> None:
    """Copies are the slope over rows less the index type's own links (a flat index has none), in float32
    vectors of 384 dimensions; fixed memory the intercept; rates the larger size's; a build under a second
    is no separate build; each row is also given over its engine's HNSW float32 row of the same run."""
    vector, links = 4 * 384, 2 * 16 * 4 + 8
    mib = 2**20

    def engine(
        rows: int, per_vector: float, disk_per_vector: float, fixed: float, rate: float, index_s: float
    ):
        return {
            "server_peak_mib": (fixed * mib + rows * per_vector) / mib,
            "disk_bytes": rows * disk_per_vector,
            "insert_vectors_per_s": rate,
            "index_s": index_s,
        }

    hnsw = (2 * vector + links, vector + links, 300)
    flat = (vector + 8, 2 * vector + 8, 200)
    small = _size(20_000, {"faiss-hnsw-none": engine(20_000, *hnsw, 9_000, 4.0),
                           "faiss-flat-none": engine(20_000, *flat, 30_000, 0.1)})  # fmt: skip
    large = _size(100_000, {"faiss-hnsw-none": engine(100_000, *hnsw, 8_000, 25.0),
                            "faiss-flat-none": engine(100_000, *flat, 32_000, 0.2)})  # fmt: skip
    matrix = {"faiss-hnsw-none": ("faiss", "hnsw", "none"), "faiss-flat-none": ("faiss", "flat", "none")}
    costs = cost_table([small, large], matrix)
    assert set(costs) == {("faiss", "hnsw", "none"), ("faiss", "flat", "none")}
    row = costs[("faiss", "flat", "none")]
    assert row["memory_copies"] == 1.0 and row["disk_copies"] == 2.0
    assert row["fixed_mib"] == 200 and row["insert_vectors_per_s"] == 32_000
    assert row["index_vectors_per_s"] is None  # 0.2 s: nothing built apart from the upload
    assert row["measured_processes"] == 2  # FAISS runs inside both client processes
    peer = costs[("faiss", "hnsw", "none")]
    assert peer["memory_copies"] == 2.0 and peer["index_vectors_per_s"] == 4_000
    ratios = against_peer(costs)
    assert list(ratios) == [("faiss", "flat", "none")]  # the peer is not its own ratio
    assert ratios[("faiss", "flat", "none")]["memory_copies"] == 0.5
    assert ratios[("faiss", "flat", "none")]["insert_vectors_per_s"] == 4.0
    assert ratios[("faiss", "flat", "none")]["index_vectors_per_s"] is None


def test_the_matrix_holds_every_index_and_quantisation_each_database_builds_here(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from apps.vdb import database

    entries = matrix_entries(["milvus", "weaviate"])
    for name in ("milvus", "weaviate"):
        declared = database(name)
        expected = {(name, i, q) for i in declared.index_types for q in declared.builds_with(i)}
        if name == "milvus":  # the PyPI server has no DiskANN: its refusal, not a failed point
            expected.remove(("milvus", "diskann", "none"))
        assert {key for _, key in entries.values() if key[0] == name} == expected
    entry, key = entries["weaviate-hnsw-pq"]
    assert key == ("weaviate", "hnsw", "pq") and entry["label"] == "weaviate-hnsw-pq"
    assert entry["collection"]["options"]["training_limit"] < 20_000  # compressed at both sizes
    assert "options" not in entries["weaviate-hnsw-none"][0]["collection"]
    assert "not measured here: milvus-diskann-none" in capsys.readouterr().out


def test_a_matrix_row_is_its_ratio_to_the_run_s_hnsw_times_the_shipped_hnsw_row() -> None:
    """Every row of an engine rests on one anchor: the shipped HNSW float32 row (measured at 1M) times the
    ratio measured in the matrix run; a figure the row lacks (no separate build) stays None."""
    from apps.vdb.resources import EngineCost

    flat = {"memory_copies": 0.5, "disk_copies": 1.0, "fixed_mib": 1.1, "insert_vectors_per_s": 2.0,
            "index_vectors_per_s": None}  # fmt: skip
    ratios = {("faiss", "flat", "none"): flat}
    shipped = {("faiss", "hnsw", "none"): EngineCost(1.5, 2.0, 1_000, 100_000, 4_000, measured_processes=2)}
    (row,) = anchored_rows(ratios, shipped).values()
    assert row == {"memory_copies": 0.75, "disk_copies": 2.0, "fixed_mib": 1_100,
                   "insert_vectors_per_s": 200_000, "index_vectors_per_s": None,
                   "measured_processes": 2}  # fmt: skip
    assert anchored_rows({("lancedb", "ivf_pq", "pq"): flat}, shipped) == {}  # no anchor: no row
