"""Sweeps of the vdb section: lists where one value is expected become points (apps/vdb/sweep.py), each
point keyed and placed on its own (pipeline/sweep.py); errors name the field as written and the index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from apps.vdb.config import VdbConfig
from core.errors import ConfigError
from pipeline.config.loader import load_config
from pipeline.sweep import plan_points
from tests.conftest import base_config

QDRANT = {"name": "qdrant", "mode": "edge"}


def points(section: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    return [(p.label, p.repeat, p.params) for p in VdbConfig.model_validate(section).points]


def errors(section: dict[str, Any]) -> list[tuple[tuple, str]]:
    with pytest.raises(ValidationError) as caught:
        VdbConfig.model_validate(section)
    return [(tuple(e["loc"]), e["msg"]) for e in caught.value.errors()]


def test_no_sweep_is_one_point_per_database() -> None:
    vdb = VdbConfig.model_validate({"databases": [QDRANT, {"name": "milvus"}]})
    assert [(p.label, p.database, p.repeat, p.params) for p in vdb.points] == [
        ("qdrant", "qdrant", 0, {}),
        ("milvus", "milvus", 0, {}),
    ]
    assert vdb.points[0].config.collection == vdb.collection  # each point is an ordinary section
    assert "label" not in vdb.model_dump()["databases"][0]  # the dump of an unswept section is unchanged


def test_cartesian_crosses_shared_and_entry_axes() -> None:
    section = {
        "databases": [{**QDRANT, "default_segment_number": [1, 4]}],
        "collection": {"hnsw_m": [16, 32]},
        "insert": {"clients_per_worker": 2, "batch_sizes": [64, 256]},  # a list by nature: no axis
    }
    got = points(section)
    assert [p[2] for p in got] == [
        {"collection.hnsw_m": 16, "qdrant.default_segment_number": 1},
        {"collection.hnsw_m": 16, "qdrant.default_segment_number": 4},
        {"collection.hnsw_m": 32, "qdrant.default_segment_number": 1},
        {"collection.hnsw_m": 32, "qdrant.default_segment_number": 4},
    ]
    assert got[3][0] == "qdrant[hnsw_m=32,default_segment_number=4]"
    vdb = VdbConfig.model_validate(section)
    last = vdb.points[3].config
    assert last.collection.hnsw_m == 32 and last.databases[0].default_segment_number == 4
    assert last.insert.batch_sizes == [64, 256]
    assert vdb.collection.hnsw_m == 16  # the section itself holds the first values


def test_zip_pairs_and_repeats_repeat_each_point() -> None:
    section = {
        "databases": [QDRANT],
        "collection": {"hnsw_m": [8, 16, 32]},
        "insert": {"clients_per_worker": [1, 2, 4]},
        "sweep": "zip",
        "repeats": 2,
    }
    got = points(section)
    assert [(p[2]["collection.hnsw_m"], p[2]["insert.clients_per_worker"], p[1]) for p in got] == [
        (8, 1, 0),
        (8, 1, 1),
        (16, 2, 0),
        (16, 2, 1),
        (32, 4, 0),
        (32, 4, 1),
    ]
    assert got[0][0] == got[1][0] == "qdrant[hnsw_m=8,clients_per_worker=1]"


def test_zip_with_unequal_lengths_names_both_lists() -> None:
    section = {
        "databases": [{**QDRANT, "default_segment_number": [1, 2, 3]}],
        "collection": {"hnsw_m": [16, 32]},
        "sweep": "zip",
    }
    ((loc, message),) = errors(section)
    assert loc == ("sweep",)
    assert "vdb.collection.hnsw_m has 2" in message
    assert "vdb.databases[0].default_segment_number has 3" in message


def test_error_names_the_field_and_the_list_index() -> None:
    assert errors({"databases": [QDRANT], "collection": {"hnsw_m": [16, 1]}})[0][0] == (
        "collection",
        "hnsw_m",
        1,
    )
    ((loc, _),) = errors(
        {"databases": [QDRANT, {**QDRANT, "label": "q2", "default_segment_number": [2, -1]}]}
    )
    assert loc == ("databases", 1, "default_segment_number", 1)
    ((loc, message),) = errors(
        {"databases": [QDRANT, {**QDRANT, "label": "q2", "collection": {"index_type": ["hnsw", "ivf_pq"]}}]}
    )
    assert loc == ("databases", 1, "collection", "index_type", 1)
    assert "not built by vdb.databases[1] (qdrant)" in message
    assert errors({"databases": [QDRANT], "collection": {"hnsw_m": []}})[0][0] == ("collection", "hnsw_m")


def test_same_database_twice_needs_distinct_labels() -> None:
    ((loc, message),) = errors({"databases": [QDRANT, QDRANT]})
    assert loc == ("databases", 1) and "label 'qdrant'" in message
    got = points({"databases": [QDRANT, {**QDRANT, "label": "qdrant-4seg", "default_segment_number": 4}]})
    assert [p[0] for p in got] == ["qdrant", "qdrant-4seg"]
    # per-entry overrides of the collection: one report across engines and index types
    vdb = VdbConfig.model_validate(
        {"databases": [{"name": "milvus"}, {"name": "milvus", "collection": {"index_type": "ivf_flat"}}]}
    )
    assert [p.label for p in vdb.points] == ["milvus", "milvus[index_type=ivf_flat]"]
    assert [p.config.collection.index_type for p in vdb.points] == ["hnsw", "ivf_flat"]
    assert vdb.points[1].params == {"collection.index_type": "ivf_flat"}


def test_labels_that_would_share_a_file_name_are_refused() -> None:
    # "q 4" and "q/4" are distinct labels but one file name, q_4: their points' links would collide
    ((loc, message),) = errors({"databases": [{**QDRANT, "label": "q 4"}, {**QDRANT, "label": "q/4"}]})
    assert loc == ("databases", 1, "label")
    assert "'q/4' and label 'q 4' would share the file name 'q_4'" in message


def test_dump_writes_the_sweep_back() -> None:
    section = {
        "databases": [QDRANT, {"name": "milvus", "label": "ivf", "collection": {"index_type": "ivf_flat"}}],
        "collection": {"hnsw_m": [16, 32]},
        "repeats": 3,
    }
    vdb = VdbConfig.model_validate(section)
    dumped = vdb.model_dump(mode="json")
    assert dumped["collection"]["hnsw_m"] == [16, 32]
    assert dumped["databases"][1]["label"] == "ivf"
    again = VdbConfig.model_validate(dumped)
    assert [(p.label, p.repeat) for p in again.points] == [(p.label, p.repeat) for p in vdb.points]
    assert len(vdb.points) == 2 * 2 * 3


def test_point_keys_depend_on_settings_not_on_the_rest_of_the_sweep(tmp_path: Path) -> None:
    one = VdbConfig.model_validate({"databases": [QDRANT], "collection": {"hnsw_m": [16, 32]}, "repeats": 2})
    more = VdbConfig.model_validate({"databases": [QDRANT], "collection": {"hnsw_m": [16, 32, 64]}})
    a = plan_points(one, tmp_path, ["ds", "q", "gt"], "cosine")
    b = plan_points(more, tmp_path, ["ds", "q", "gt"], "cosine")
    assert len({p.key for p in a}) == 4  # repeats are distinct points
    assert [p.key for p in a if p.point.repeat == 0] == [p.key for p in b[:2]]  # adding a value reruns none
    assert a[0].directory == tmp_path / "vdb-points" / a[0].key
    assert [p.link for p in a[:2]] == ["qdrant[hnsw_m=16].r0", "qdrant[hnsw_m=16].r1"]
    assert not a[0].complete
    renamed = VdbConfig.model_validate(
        {"databases": [{**QDRANT, "label": "edge"}], "collection": {"hnsw_m": 16}}
    )
    assert plan_points(renamed, tmp_path, ["ds", "q", "gt"], "cosine")[0].key == b[0].key  # label not keyed


def test_loader_error_has_the_line_of_the_bad_list_item(small_corpus: Path, tmp_path: Path) -> None:
    vdb = {"databases": [QDRANT], "collection": {"hnsw_m": [16, 1]}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(base_config(small_corpus, tmp_path / "wd", vdb=vdb), sort_keys=False))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = str(caught.value)
    assert "vdb.collection.hnsw_m.1" in text and "(got 1)" in text
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if t.strip() == "- 1")
    assert caught.value.line == line


def test_an_entry_overrides_query_and_cluster_sections_merged_key_by_key() -> None:
    cluster = {
        "images": {"milvus": "m.sif"},
        "storage": {"medium": "memory", "ssd_path": "/ssd"},
        "overrides": {"milvus": {"workers_per_node": 2}},
    }
    media = {"storage": {"medium": ["memory", "ssd"]}, "overrides": {}}  # {}: no shared overrides
    section = {
        "databases": [
            {"name": "milvus", "label": "media", "cluster": media},
            {"name": "milvus", "label": "short", "query": {"duration_s": 1.0}},
        ],
        "cluster": cluster,
        "query": {"duration_s": 5.0},
    }
    vdb = VdbConfig.model_validate(section)
    media, short = vdb.points[:2], vdb.points[2]
    assert [p.label for p in vdb.points] == ["media[medium=memory]", "media[medium=ssd]", "short"]
    assert [p.config.cluster.storage.medium for p in media] == ["memory", "ssd"]
    assert {p.config.cluster.storage.ssd_path for p in media} == {"/ssd"}  # the shared keys stay
    assert [p.config.query.duration_s for p in vdb.points] == [5.0, 5.0, 1.0]
    assert [bool(p.config.cluster.overrides) for p in vdb.points] == [False, False, True]
    assert short.params == {"query.duration_s": 1.0}
    assert VdbConfig.model_validate(vdb.model_dump()).model_dump() == vdb.model_dump()  # round trip


def test_an_entry_sweeps_its_own_cores_and_binding() -> None:
    section = {
        "databases": [
            {"name": "weaviate", "label": "cores", "cores_per_worker": [1, 2]},
            {"name": "weaviate", "label": "free", "bind": "none"},
            {"name": "milvus"},
        ],
        "cores_per_worker": 2,
    }
    vdb = VdbConfig.model_validate(section)
    got = [(p.label, p.config.cores_per_worker, p.config.bind) for p in vdb.points]
    assert got == [
        ("cores[cores_per_worker=1]", 1, "cores"),
        ("cores[cores_per_worker=2]", 2, "cores"),
        ("free", 2, "none"),
        ("milvus", 2, "cores"),
    ]
    assert vdb.points[0].params == {"cores_per_worker": 1}
    assert VdbConfig.model_validate(vdb.model_dump()).model_dump() == vdb.model_dump()  # round trip
    bad = {"databases": [{"name": "weaviate", "cores_per_worker": [1, 0]}]}
    assert errors(bad)[0][0] == ("databases", 0, "cores_per_worker", 1)


def test_a_section_built_in_code_keeps_each_points_values() -> None:
    """VdbConfig(...) validates into the instance being built: the points must still be their own."""
    built = VdbConfig(databases=[QDRANT], insert={"workers": [1, 2]})
    assert [p.config.insert.workers for p in built.points] == [1, 2]
    assert built.insert.workers == 1  # the section itself holds the first values


# --- HPC: one database job shape per point that changes it ----------------------------------------------


@pytest.fixture
def swept_polaris(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """configs/polaris.yaml with Qdrant alone, its workers, shards and nodes swept together."""
    from tests.conftest import REPO
    from tests.pipeline.test_hpc_render import FIXED_ENV

    for key, value in FIXED_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("QUEUE", raising=False)
    text = (REPO / "configs" / "polaris.yaml").read_text()

    def write(nodes: list[int]) -> Path:
        config = yaml.safe_load(text)
        vdb = config["vdb"]
        vdb["databases"] = [db for db in vdb["databases"] if db["name"] == "qdrant" and "label" not in db]
        vdb["cluster"]["overrides"] = {}
        vdb["cluster"].update(workers=[40, 80], nodes=nodes)
        vdb["collection"]["shards"] = [40, 80]
        vdb["sweep"] = "zip"
        vdb["repeats"] = 2
        path = tmp_path / "polaris-sweep.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False).replace("../", str(REPO) + "/"))
        return path

    return write


def test_hpc_plan_renders_one_job_per_deployment_shape(swept_polaris) -> None:
    from pipeline.hpc_plan import pilot_shapes, render_artifacts, render_plan

    loaded = load_config(swept_polaris([10, 20]))
    assert len(loaded.config.vdb.points) == 4  # 2 shapes x 2 repeats
    shapes = pilot_shapes(loaded.config.vdb)
    assert [len(points) for _, points in shapes] == [2, 2]  # repeats share their shape's job script
    rendered = render_artifacts(loaded)
    jobs = sorted(name for name in rendered if name.endswith("/job.sh"))
    assert len(jobs) == 2 and all(name.startswith("qdrant[") for name in jobs)
    selects = sorted(line for name in jobs for line in rendered[name].splitlines() if "select=" in line)
    assert [s.split("select=")[1].split(":")[0] for s in selects] == ["10", "20"]
    servers = {name: rendered[name.replace("job.sh", "servers.txt")] for name in jobs}
    assert (
        sorted(text.count("\n") for text in servers.values())[0]
        < sorted(text.count("\n") for text in servers.values())[1]
    )  # the 80-rank shape lists more ranks
    text = render_plan(loaded, check=False)
    assert "rank 79 " in text and "used by 2 points" in text


def test_hpc_check_names_the_swept_value_that_does_not_fit(swept_polaris) -> None:
    from pipeline.hpc_plan import check_or_raise

    loaded = load_config(swept_polaris([10, 2]))  # 80 ranks on 2 nodes x 4: too few nodes
    with pytest.raises(ConfigError) as caught:
        check_or_raise(loaded)
    text = str(caught.value)
    assert "vdb.cluster.workers.1" in text or "vdb.cluster.nodes.1" in text, text
    assert "vdb.cluster.workers.0" not in text and "vdb.cluster.nodes.0" not in text


def test_an_entrys_k_above_the_ground_truth_is_refused_before_anything_runs(
    small_corpus: Path, tmp_path: Path
) -> None:
    vdb = {"databases": [{**QDRANT, "label": "deep", "query": {"k": [100]}}]}
    path = tmp_path / "deep.yaml"
    path.write_text(yaml.safe_dump(base_config(small_corpus, tmp_path / "wd", vdb=vdb), sort_keys=False))
    with pytest.raises(ConfigError, match=r"vdb\.query\.k of point 'deep' 100 exceeds groundtruth\.k 10"):
        load_config(path)


@pytest.mark.parametrize("label", [".", "..", "../x", 5, True])
def test_a_label_is_a_string_and_never_names_a_directory(label: object) -> None:
    from apps.vdb.sweep import label_slug

    if isinstance(label, str):  # accepted, as a plain file name inside the stage directory
        (point,) = VdbConfig.model_validate({"databases": [{**QDRANT, "label": label}]}).points
        assert label_slug(point.label) not in ("", ".", "..") and "/" not in label_slug(point.label)
    else:
        ((loc, message),) = errors({"databases": [{**QDRANT, "label": label}]})
        assert loc == ("databases", 0, "label") and "label must be a string" in message


def test_labels_differing_only_in_case_are_refused() -> None:  # one file on macOS's file system
    ((loc, message),) = errors({"databases": [{**QDRANT, "label": "HNSW"}, {**QDRANT, "label": "hnsw"}]})
    assert loc == ("databases", 1, "label") and "case is ignored" in message


def test_open_loop_knobs_count_in_a_point_key_only_when_their_rate_is_set() -> None:
    """Points measured before the open loop existed keep their keys: an unset rate leaves its knobs out."""
    from pipeline.sweep import point_params

    def params(query: dict[str, Any], mixed: dict[str, Any] | None = None) -> dict[str, Any]:
        section = {"databases": [{"name": "milvus"}], "query": query, "mixed": mixed}
        [point] = VdbConfig.model_validate(section).points
        return point_params(point, "cosine")

    off = params({})
    assert not {"rate", "arrivals", "seed", "p99_bound_ms", "max_lag_ms"} & set(off["query"])
    assert params({"seed": 5, "max_lag_ms": 3}) == off  # without a rate they change nothing
    assert params({"rate": [100]}) != params({"rate": [100], "seed": 5}) != off
    mixed_off = params({}, {"insert_rate": 100})
    assert "query_rate" not in mixed_off["mixed"] and "seed" not in mixed_off["mixed"]
    assert params({}, {"insert_rate": 100, "query_rate": 50})["mixed"]["query_rate"] == 50


def test_a_sweep_beyond_max_points_is_refused_until_raised() -> None:
    section = {
        "databases": [QDRANT, {"name": "faiss"}],
        "collection": {"hnsw_m": [8, 12, 16, 24, 32]},
        "repeats": 3,
        "max_points": 20,
    }
    ((_, message),) = errors(section)
    assert "the sweep expands to 30 points, more than vdb.max_points 20" in message
    assert len(VdbConfig.model_validate({**section, "max_points": 30}).points) == 30
    # the default bound: 1,000 points (a mistyped list of 10,000 values is refused)
    ((_, message),) = errors({"databases": [QDRANT], "collection": {"hnsw_m": list(range(4, 1005))}})
    assert "1,001 points, more than vdb.max_points 1,000" in message


def test_plan_says_what_the_sweep_will_cost(tmp_path: Path) -> None:
    """Points still to run, pilot jobs, query settings and the floor of their measured windows."""
    from pipeline.sweep import sweep_cost

    config = base_config(
        tmp_path / "c.jsonl",
        tmp_path,
        vdb={
            "databases": [QDRANT, {"name": "faiss"}],
            "collection": {"hnsw_m": [8, 16]},
            "query": {"ef": [16, 32, 64], "batch_size": [1, 8], "duration_s": 5},
        },
    )
    vdb = VdbConfig.model_validate(config["vdb"])
    plans = plan_points(vdb, tmp_path / "store", ["d", "q", "g"], "cosine")
    line = sweep_cost(vdb, plans)
    assert line.startswith("sweep cost: 4 of 4 point(s) to run, 0 pilot job(s), 24 query setting(s)")
    assert "at least 2 min of measured query windows; about 6 s of start-ups, warm-ups and stops" in line
    # a local sweep's total: its windows and each engine's measured start, warm-up and stop per point
    assert line.endswith(
        ": about 2 min in all, besides the upload and index of 4 point(s) of faiss, qdrant (not estimated)"
    )
    # the progress ETA's weights are the same parts, point by point; a point with none weighs the mean (1)
    from apps.vdb.resources import LOCAL_POINT_OVERHEAD_S
    from pipeline.sweep import expected_seconds

    assert expected_seconds(plans, {}, local=True) == [
        30 + LOCAL_POINT_OVERHEAD_S[p.point.database] for p in plans
    ]
    assert expected_seconds(plans, {}, local=False) == [30.0] * 4
    untimed = VdbConfig.model_validate(
        {"databases": [QDRANT, {"name": "faiss"}], "query": {"duration_s": None}}
    )
    untimed_plans = plan_points(untimed, tmp_path / "store", ["d", "q", "g"], "cosine")
    for local in (False, True):  # an engine's start-up alone is no measure of a point
        assert expected_seconds(untimed_plans, {}, local) == [1.0, 1.0]
    # beside a timed point, an untimed one weighs the mean of the timed ones
    assert expected_seconds([plans[0], untimed_plans[0]], {}, False) == [30.0, 30.0]
    # on a cluster, a pilot's start is its queue wait: no local figure stands in for it, nor a total
    cluster = {"databases": [{"name": "milvus"}], "cluster": {"images": {"milvus": "m.sif"}}}
    milvus = VdbConfig.model_validate(cluster)
    line = sweep_cost(milvus, plan_points(milvus, tmp_path / "store", ["d", "q", "g"], "cosine"))
    assert ", 1 pilot job(s)," in line and "in all" not in line
    assert line.endswith("(the pilots' queue waits and start-ups come on top)")
    # one allocation: the pilots start inside the run's one job, not as jobs of their own
    assert ", 0 pilot deployment(s) inside the one allocation, 24 query" in sweep_cost(
        vdb, plans, one_job=True
    )


def test_every_database_has_its_measured_time_per_local_point() -> None:
    from apps.vdb import DATABASES
    from apps.vdb.resources import LOCAL_POINT_OVERHEAD_S

    assert set(LOCAL_POINT_OVERHEAD_S) == set(DATABASES)  # a new engine is measured, not left out of plan


def test_the_sweep_cost_counts_the_settings_the_query_stage_runs(tmp_path: Path) -> None:
    """An in-process engine serves one client, a flat index has no ef, each offered rate follows its
    closed-loop setting: the count is that of the stage's own sweep, not the product of the lists."""
    from pipeline.sweep import query_settings

    query = {"ef": [16, 32], "batch_size": [1], "clients": [1, 2], "k": [10]}
    cases = [
        ({"databases": [{"name": "faiss"}], "query": query}, 2),  # clients 1 only
        ({"databases": [{"name": "milvus"}], "query": query}, 4),
        ({"databases": [{"name": "milvus"}], "collection": {"index_type": "flat"}, "query": query}, 2),
        ({"databases": [{"name": "milvus"}], "query": {**query, "rate": [100.0, 200.0]}}, 12),
    ]
    for vdb_config, expected in cases:
        vdb = VdbConfig.model_validate(vdb_config)
        (point,) = vdb.points
        assert query_settings(point) == expected, vdb_config


def test_a_finished_sweep_costs_nothing(tmp_path: Path) -> None:
    from dataclasses import replace

    from pipeline.sweep import sweep_cost

    vdb = VdbConfig.model_validate({"databases": [QDRANT]})
    plans = plan_points(vdb, tmp_path / "store", ["d", "q", "g"], "cosine")
    done = [replace(p, directory=tmp_path) for p in plans]  # a directory with a manifest of the key
    (tmp_path / "manifest.json").write_text(f'{{"key": "{plans[0].key}", "files": []}}')
    assert sweep_cost(vdb, done) == "sweep cost: none: all 1 point(s) are done"


def test_a_plan_hashes_a_finished_points_raw_files_once(tmp_path: Path, monkeypatch) -> None:
    """complete, damage() and the sweep cost all ask of a point; its raw files are hashed once a plan."""
    import json

    import core.store
    from pipeline.sweep import sweep_cost

    vdb = VdbConfig.model_validate({"databases": [QDRANT]})
    (point,) = plan_points(vdb, tmp_path / "store", ["d", "q", "g"], "cosine")
    point.directory.mkdir(parents=True)
    raw = point.directory / "raw.parquet"
    raw.write_bytes(b"latencies" * 100)
    entry = {"file": "raw.parquet", "bytes": 900, "sha256": core.store.sha256_file(raw)}
    (point.directory / "manifest.json").write_text(json.dumps({"key": point.key, "files": [entry]}))
    hashed: list[Path] = []
    real = core.store.sha256_file
    monkeypatch.setattr(core.store, "sha256_file", lambda path: hashed.append(path) or real(path))
    assert point.complete and point.damage() == [] and point.complete
    assert sweep_cost(vdb, [point]) == "sweep cost: none: all 1 point(s) are done"
    assert hashed == [raw]


def test_plan_says_an_in_process_engine_queries_with_one_client(tmp_path: Path) -> None:
    """vdb.query.clients [1, 4]: FAISS and Qdrant edge serve their one client; plan's point line says so."""
    from pipeline.sweep import describe

    config = base_config(
        tmp_path / "c.jsonl",
        tmp_path,
        vdb={"databases": [QDRANT, {"name": "faiss"}, {"name": "milvus"}], "query": {"clients": [1, 4]}},
    )
    vdb = VdbConfig.model_validate(config["vdb"])
    lines = {row[1]: row[3] for row in describe(plan_points(vdb, tmp_path / "store", ["d"], "cosine"))}
    note = "\n       queries with 1 client (an in-process engine: vdb.query.clients [1, 4] does not apply)"
    assert note in lines["qdrant"] and note in lines["faiss"], lines
    assert "client" not in lines["milvus"], lines
