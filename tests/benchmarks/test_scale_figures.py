"""``benchmarks.scale``'s arithmetic: the median of a size's repeats; which insert rate a target reads."""

from __future__ import annotations

from benchmarks.scale.__main__ import TARGETS, insert_summary, median_figures, repeats_for


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
