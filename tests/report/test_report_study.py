"""The study's figures from a sweep's rows: which are drawn, what they plot (medians and ranges over
repeats), what their captions say they rest on, and which are skipped for lack of an axis."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from apps.evaluate.results import normalize_rows, write_results
from apps.report.document import write_report
from apps.report.mixed import mixed_table
from apps.report.study import SPECS, caption, figure_data, study_section

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SPREAD = (1.0, 1.2, 0.7)  # repeat r measures value x SPREAD[r]: median x1.0, min x0.7, max x1.2
SPEC = {spec.name: spec for spec in SPECS}


def point(database: str, sweep: dict[str, Any]) -> dict[str, Any]:
    values = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in sweep.items())
    return {"database": database, "label": f"{database}[{values}]", "sweep": dict(sweep)}


def setting(ef: int) -> str:
    return f"ef={ef},batch=8,clients=1,k=10"


def query(base: dict, repeat: int, ef: int, qps: float, recall: float, latency: float) -> dict[str, Any]:
    s = SPREAD[repeat]
    return {
        **base,
        "repeat": repeat,
        "stage": "query",
        "setting": setting(ef),
        "ef": ef,
        "batch_size": 8,
        "clients": 1,
        "k": 10,
        "qps": qps * s,
        "latency_mean_ms": latency * s,
        "p99_ms": 2 * latency * s,
        "recall": recall,
        "queries_sent": 400 + repeat,
        "distinct_queries": 100,
        "window_s": 10.0 + repeat,
    }


def sweep_rows() -> list[dict[str, Any]]:
    """Weaviate nodes x insert clients, Qdrant segments, Milvus cores, FAISS rows; 3 repeats each."""
    rows: list[dict[str, Any]] = []
    for nodes, clients, repeat in itertools.product((1, 2, 3), (1, 2, 4), range(3)):
        base = point("weaviate", {"weaviate.nodes": nodes, "insert.clients_per_worker": clients})
        rate = 1000.0 * nodes + 100.0 * clients
        rows.append(
            {
                **base,
                "repeat": repeat,
                "stage": "insert",
                "setting": "batch=64",
                "batch_size": 64,
                "clients": clients,
                "workers": 1,
                "vectors": 5000,
                "upload_s": 5000 / (rate * SPREAD[repeat]),
                "insert_vectors_per_s": rate * SPREAD[repeat],
            }
        )
        rows.append(query(base, repeat, 64, qps=500.0 * nodes + clients, recall=0.96, latency=4.0))
    for segments, repeat in itertools.product((1, 4), range(3)):
        base = point("qdrant", {"qdrant.default_segment_number": segments})
        rows.append({**base, "repeat": repeat, "stage": "index", "index_s": 2.0, "segments": segments + 1})
        rows.append(query(base, repeat, 16, qps=900.0, recall=0.80 + 0.02 * segments, latency=1.0))
        rows.append(query(base, repeat, 64, qps=300.0, recall=0.90 + 0.02 * segments, latency=3.0 * segments))
    for cores, repeat in itertools.product((1, 2, 4), range(3)):
        base = point("milvus", {"cores_per_worker": cores})
        rows.append({**base, "repeat": repeat, "stage": "index", "index_s": 12.0 / cores * SPREAD[repeat]})
        rows.append(query(base, repeat, 16, qps=800.0 * cores, recall=0.90, latency=2.0 / cores))
        rows.append(query(base, repeat, 64, qps=200.0 * cores, recall=0.99, latency=8.0 / cores))
    for size, repeat in itertools.product((1000, 4000), range(3)):  # FAISS over the dataset size
        base = point("faiss", {"insert.rows": size})
        rows.append({**base, "repeat": repeat, "stage": "index", "index_s": size / 500.0})
        rows.append(query(base, repeat, 64, qps=5000.0, recall=0.99, latency=size / 2000.0))
    return normalize_rows(rows)


def lines(data, metric: str) -> dict[str, list[tuple[float, float, float, float, int]]]:
    return {s.line: [(p.x, p.median, p.low, p.high, p.repeats) for p in s.points] for s in data.of(metric)}


def test_insert_throughput_versus_clients_is_the_median_over_repeats() -> None:
    data = figure_data(sweep_rows(), SPEC["study_insert_clients"])
    assert data is not None and data.axis == "clients"
    got = lines(data, "insert_rate")
    assert set(got) == {f"weaviate (nodes={n})" for n in (1, 2, 3)}  # clients_per_worker is the axis
    expected = [(c, 2000.0 + 100 * c) for c in (1, 2, 4)]
    assert [(x, pytest.approx(m)) for x, m, *_ in got["weaviate (nodes=2)"]] == expected
    _, median, low, high, repeats = got["weaviate (nodes=2)"][2]
    assert (low, high, repeats) == (pytest.approx(0.7 * median), pytest.approx(1.2 * median), 3)


def test_insert_and_query_versus_workers() -> None:
    rows = sweep_rows()
    insert = lines(figure_data(rows, SPEC["study_insert_workers"]), "insert_rate")
    assert set(insert) == {f"weaviate (clients_per_worker={c})" for c in (1, 2, 4)}
    assert [p[0] for p in insert["weaviate (clients_per_worker=4)"]] == [1, 2, 3]
    assert insert["weaviate (clients_per_worker=4)"][0][1] == pytest.approx(1400.0)
    data = figure_data(rows, SPEC["study_query_workers"])
    assert data.axis == "weaviate.nodes"
    qps = lines(data, "qps")[f"weaviate (clients_per_worker=1) @ {setting(64)}"]
    assert [(x, m, r) for x, m, _, _, r in qps] == [(1, 501.0, 3), (2, 1001.0, 3), (3, 1501.0, 3)]


def test_index_and_query_versus_cores_pick_one_setting_at_target_recall() -> None:
    rows = sweep_rows()
    index = lines(figure_data(rows, SPEC["study_index_cores"]), "index_s")
    assert index == {
        "milvus": [
            (c, pytest.approx(12.0 / c), pytest.approx(8.4 / c), pytest.approx(14.4 / c), 3)
            for c in (1, 2, 4)
        ]
    }
    data = figure_data(rows, SPEC["study_query_cores"])
    # ef=16 is faster but never reaches recall 0.95: the line is ef=64's
    assert list(lines(data, "qps")) == [f"milvus @ {setting(64)}"]
    assert [p[1] for p in lines(data, "qps")[f"milvus @ {setting(64)}"]] == [200.0, 400.0, 800.0]
    assert [p[1] for p in lines(data, "latency_mean_ms")[f"milvus @ {setting(64)}"]] == [8.0, 4.0, 2.0]
    text = caption(data)
    assert "9 query rows" in text and "3 points, 3 repeats each" in text
    assert "400–402 queries sent in 10.0–12.0 s" in text and "recall ≥ 0.95" in text


def test_an_unbound_point_is_a_marker_beside_its_core_counts() -> None:
    # Aurora's Fig. 5 sweep: cores_per_worker [2, 4, 4] zipped with bind [cores, cores, none]
    rows = []
    for cores, bind in [(2, "cores"), (4, "cores"), (4, "none")]:
        base = point("qdrant", {"qdrant.cluster.cores_per_worker": cores, "qdrant.cluster.bind": bind})
        speed = 100.0 * cores * (0.5 if bind == "none" else 1.0)
        for repeat in range(2):
            rows.append({**query(base, repeat, 64, speed, 0.97, 1.0), "status": "ok"})
            rows.append(
                {**query(base, repeat, 16, 3 * speed, 0.99 if bind == "none" else 0.5, 1.0), "status": "ok"}
            )
    got = lines(figure_data(rows, SPEC["study_query_cores"]), "qps")
    # the unbound marker is measured at its entry's setting (ef=64), not at the ef it alone would pick
    assert got == {
        f"qdrant (bind=cores) @ {setting(64)}": [
            (2.0, 220.0, 200.0, 240.0, 2),
            (4.0, 440.0, 400.0, 480.0, 2),
        ],
        f"qdrant (bind=none) @ {setting(64)}": [(4.0, 220.0, 200.0, 240.0, 2)],
    }
    alone = [r for r in rows if r["sweep"]["qdrant.cluster.bind"] == "none"]
    assert figure_data(alone, SPEC["study_query_cores"]) is None  # one x in all: no figure


def test_each_line_over_several_x_keeps_its_own_setting() -> None:
    # cores x hnsw.m: the m=32 line reaches recall 0.95 at ef=16 (and is fastest there); m=16 only at ef=64
    rows = []
    for cores, m in itertools.product((2, 4), (16, 32)):
        base = point("qdrant", {"qdrant.cores_per_worker": cores, "collection.hnsw_m": m})
        for repeat in range(2):
            rows.append({**query(base, repeat, 64, 100.0 * cores, 0.97, 1.0), "status": "ok"})
            fast = 0.99 if m == 32 else 0.5
            rows.append({**query(base, repeat, 16, 300.0 * cores, fast, 1.0), "status": "ok"})
    got = lines(figure_data(rows, SPEC["study_query_cores"]), "qps")
    assert sorted(got) == [f"qdrant (hnsw_m=16) @ {setting(64)}", f"qdrant (hnsw_m=32) @ {setting(16)}"]


def test_segments_fall_back_to_the_highest_recall_setting() -> None:
    data = figure_data(sweep_rows(), SPEC["study_segments"])
    assert data.axis == "qdrant.default_segment_number"
    # neither setting reaches 0.95 at 1 segment: the highest lowest recall (ef=64) is plotted
    recall = lines(data, "recall")[f"qdrant @ {setting(64)}"]
    assert [(x, pytest.approx(m)) for x, m, *_ in recall] == [(1, pytest.approx(0.92)), (4, 0.98)]
    assert [p[1] for p in lines(data, "latency_mean_ms")[f"qdrant @ {setting(64)}"]] == [3.0, 12.0]


def test_section_writes_every_figure_and_names_its_data(tmp_path: Path) -> None:
    section, drawn = study_section(sweep_rows(), tmp_path)
    assert set(drawn) == set(SPEC)
    for path in drawn.values():
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000
    text = "\n".join(section)
    assert (
        "## Study figures" in text and "![Index time versus cores per worker](study_index_cores.png)" in text
    )
    assert "27 insert rows (9 points, 3 repeats each)" in text  # the clients figure: every weaviate upload
    assert "one upload of 5,000 vectors" in text
    assert "Not drawn:" not in text and "Mixed insert + query" not in text  # no mixed rows here


def test_missing_axes_are_skipped_and_listed(tmp_path: Path) -> None:
    rows = [r for r in sweep_rows() if r["database"] == "qdrant"]  # only segments are swept
    section, drawn = study_section(rows, tmp_path)
    assert list(drawn) == ["study_segments"]
    text = "\n".join(section)
    for name in set(SPEC) - {"study_segments"}:
        assert f"(`{name}`): not drawn, the sweep has no axis" in text
        assert not (tmp_path / f"{name}.png").exists()
    # one value per axis (an unswept run): nothing drawn, said in one line, not a list of every figure
    single = [r for r in sweep_rows() if r["label"] == "milvus[cores_per_worker=2]"]
    section, drawn = study_section(single, tmp_path / "single")
    text = "\n".join(section)
    assert drawn == {} and "not drawn" not in text and "None: the results vary no axis" in text


def test_an_axis_swept_together_with_another_joins_it() -> None:
    rows = []
    for (cores, nodes), repeat in itertools.product(((1, 1), (2, 2), (4, 3)), range(3)):
        base = point("weaviate", {"cores_per_worker": cores, "weaviate.nodes": nodes})
        rows.append({**base, "repeat": repeat, "stage": "index", "index_s": 10.0 / cores})
    data = figure_data(normalize_rows(rows), SPEC["study_index_cores"])
    assert list(lines(data, "index_s")) == ["weaviate"]  # one line, not three single points
    assert "swept together with weaviate.nodes" in caption(data)
    # Weaviate indexes as vectors arrive: its caption says what its index time is (review 46b F5)
    assert "weaviate builds the index as vectors arrive: the time drawn is the wait" in caption(data)


def test_a_thread_count_written_as_text_is_a_cores_axis() -> None:
    rows = [
        {**point("milvus", {"milvus.env.GOMAXPROCS": threads}), "repeat": 0, "stage": "index", "index_s": s}
        for threads, s in (("1", 9.0), ("2", 5.0), ("auto", 4.0))
    ]
    data = figure_data(normalize_rows(rows), SPEC["study_index_cores"])
    assert data.axis == "milvus.env.GOMAXPROCS" and "as vectors arrive" not in caption(data)
    assert [(p.x, p.median) for p in data.of("index_s")[0].points] == [(1.0, 9.0), (2.0, 5.0)]


def test_mixed_degradation_table(tmp_path: Path) -> None:
    rows = []
    for repeat, s in enumerate(SPREAD):
        for stage, qps, p99 in (("mixed_baseline", 800.0, 10.0), ("mixed", 400.0, 30.0)):
            rows.append(
                {
                    "database": "qdrant",
                    "label": None,
                    "stage": stage,
                    "status": "ok",
                    "setting": "ef=64",
                    "repeat": repeat,
                    "qps": qps * s,
                    "latency_mean_ms": 5.0,
                    "latency_p99_ms": p99,
                    "recall": 0.97,
                }
            )
    table = mixed_table(rows)
    assert table[0].startswith("| point | pattern | setting | repeats | QPS")
    baseline = next(line for line in table if "| baseline |" in line)
    assert "| 3 | 800 (560–960) |" in baseline
    ratio = next(line for line in table if "mixed ÷ baseline" in line)
    assert ratio.endswith("| 0.50× | 1.00× | 3.00× | 1.00× |")
    assert mixed_table([r for r in rows if r["stage"] == "mixed_baseline"]) == []
    section, _ = study_section(rows, tmp_path)
    assert "### Mixed insert + query: degradation" in section and ratio in section


def test_report_draws_study_figures_from_results_parquet(tmp_path: Path) -> None:
    write_results(sweep_rows(), tmp_path / "results.parquet")
    written = write_report(tmp_path / "results.parquet", tmp_path / "report")
    report = written["report"].read_text()
    assert "## Study figures" in report and "(study_segments.png)" in report
    assert set(SPEC) <= set(written["figures"])
    assert "recall_qps" in written["figures"]  # the Pareto plot stays


def test_drawn_lines_sit_on_their_x_values_in_every_panel(tmp_path: Path, monkeypatch) -> None:
    """One line per panel: no side-by-side shift; the segments labels do not disturb the second panel."""
    import apps.report.study as study

    figures = []
    monkeypatch.setattr(study, "save_figure", lambda figure, path: figures.append(figure) or path)
    rows = sweep_rows()
    data = figure_data(rows, SPEC["study_segments"])
    study.draw(data, tmp_path / "s.png", study._segments(rows))
    (figure,) = figures
    assert [list(axes.lines[0].get_xdata()) for axes in figure.axes] == [[1.0, 4.0], [1.0, 4.0]]
    assert [t.get_text() for t in figure.axes[0].texts] == ["2 seg.", "5 seg."]
    recall, latency = (axes.get_ylim()[0] for axes in figure.axes)
    assert latency == 0 and recall > 0.5  # a time read from zero; recall keeps its zoom


def test_index_and_query_time_versus_dataset_size_have_a_line_per_worker_count() -> None:
    """001 Figs. 3 and 5: index build and query time against the rows loaded, per number of workers."""
    rows = []
    for (size, workers), repeat in itertools.product(itertools.product((1000, 2000, 4000), (1, 2)), range(3)):
        base = point("qdrant", {"insert.rows": size, "cluster.workers": workers})
        rows.append({**base, "repeat": repeat, "stage": "index", "index_s": size / 100.0 / workers})
        rows.append(query(base, repeat, 64, qps=1000.0, recall=0.99 - size / 1e6, latency=size / 1000.0))
    rows = normalize_rows(rows)
    index = figure_data(rows, SPEC["study_index_rows"])
    assert index is not None and index.axis == "insert.rows"
    got = lines(index, "index_s")
    assert len(got) == 2  # one line per worker count
    by_workers = {name: [(x, median) for x, median, *_ in points] for name, points in got.items()}
    assert sorted(by_workers.values()) == [
        [(1000.0, 5.0), (2000.0, 10.0), (4000.0, 20.0)],
        [(1000.0, 10.0), (2000.0, 20.0), (4000.0, 40.0)],
    ]
    queries = figure_data(rows, SPEC["study_query_rows"])
    assert queries is not None
    medians = [p.median for p in next(iter(queries.of("latency_mean_ms"))).points]
    assert medians == pytest.approx([medians[0], 2 * medians[0], 4 * medians[0]])  # the repeats' median


def test_points_are_listed_with_their_numbers_in_numeric_order() -> None:
    """The summary (report and console headline) lists rows=2000 before rows=10000, as plan does."""
    from apps.evaluate.results import ResultRows

    rows = []
    for size in (10000, 2000, 5000):
        base = point("faiss", {"insert.rows": size})
        rows.append(query(base, 0, 64, qps=5000.0, recall=0.99, latency=1.0))
    names = ResultRows(normalize_rows(rows)).databases
    assert names == ["faiss[rows=2000]", "faiss[rows=5000]", "faiss[rows=10000]"]
