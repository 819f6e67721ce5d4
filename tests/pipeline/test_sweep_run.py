"""A swept run end to end through the CLI with Qdrant's embedded engine: one result row per point x
setting x repeat with the swept parameters as columns, and an interrupted sweep that resumes at its
first unfinished point without running a finished one again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.config.loader import load_config
from pipeline.plan import build_plan
from pipeline.sweep import PointPlan, point_state
from tests.conftest import base_config, run_cli, sample_records, write_jsonl

pytestmark = pytest.mark.slow

QDRANT = {"name": "qdrant", "mode": "edge", "indexing_threshold_kb": 1, "full_scan_threshold_kb": 1}
# A short measured window per setting (the default is 10 s): the tests check the sweep's bookkeeping.
QUERY = {"ef": [16, 64], "batch_size": [8], "clients": [1], "k": [10], "warmup_queries": 2, "duration_s": 0.5}


def vdb(**extra) -> dict:
    return {
        "databases": [{**QDRANT, "default_segment_number": [1, 2]}],
        "collection": {"index_type": "hnsw", "hnsw_m": 16, "ef_construction": 64},
        "insert": {"batch_sizes": [64], "clients_per_worker": 1},
        "query": QUERY,
        **extra,
    }


def newest_provenance(workdir: Path) -> dict:
    records = [json.loads(p.read_text()) for p in (workdir / "runs").glob("*/provenance.json")]
    return max(records, key=lambda record: record["started"])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("sweepcorpus") / "c.jsonl", sample_records(40))


def test_two_points_two_repeats_give_rows_with_parameter_columns(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(base_config(corpus, tmp_path / "wd", vdb=vdb(repeats=2))))
    listed = run_cli("plan", str(path))
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert listed.stdout.count("qdrant[default_segment_number=") >= 4 and "to run" in listed.stdout

    result = run_cli("run", str(path))
    assert result.returncode == 0, result.stderr[-4000:]
    prov = newest_provenance(tmp_path / "wd")
    report_dir = Path(prov["outputs"]["vdb"]) / "report"
    table = pq.read_table(report_dir / "results.parquet")
    assert "qdrant.default_segment_number" in table.column_names
    rows = table.to_pylist()
    queries = [r for r in rows if r["stage"] == "query"]
    # 2 points x 2 query settings x 2 repeats, every one a measurement of its own point
    assert len(queries) == 8
    got = sorted((r["qdrant.default_segment_number"], r["repeat"], r["ef"]) for r in queries)
    assert got == sorted((s, rep, ef) for s in (1, 2) for rep in (0, 1) for ef in (16, 64))
    assert {r["label"] for r in rows} == {
        "qdrant[default_segment_number=1]",
        "qdrant[default_segment_number=2]",
    }
    assert len({r["point"] for r in rows}) == 4 and all(r["database"] == "qdrant" for r in rows)
    assert all(r["recall"] > 0.5 and r["qps"] > 0 for r in queries)
    # every point (and repeat) indexed on its own
    index = {
        (r["qdrant.default_segment_number"], r["repeat"]): r["segments"]
        for r in rows
        if r["stage"] == "index"
    }
    assert len(index) == 4
    report = (report_dir / "report.md").read_text()
    assert "qdrant[default_segment_number=2]" in report
    assert "Repeats" in report and "median" in report
    # the study's segments figure from the real sweep: both points, 2 repeats each, named in its caption
    assert (report_dir / "study_segments.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "(study_segments.png)" in report and "4 query rows (2 points, 2 repeats each)" in report
    assert "(`study_query_cores`): not drawn, the sweep has no axis" in report
    tasks = prov["stages"]["vdb"]["tasks"]
    assert [(t["label"], t["repeat"]) for t in tasks] == [
        ("qdrant[default_segment_number=1]", 0),
        ("qdrant[default_segment_number=1]", 1),
        ("qdrant[default_segment_number=2]", 0),
        ("qdrant[default_segment_number=2]", 1),
    ]
    listed = run_cli("plan", str(path))
    assert listed.stdout.count("done") >= 4 and "to run" not in listed.stdout.split("point")[-1]
    # The report gathers every point's vectors in one pass over the dataset, not one pass per point.
    import apps.dataset.lookup as lookup
    from pipeline.rerender import rerender
    from pipeline.runs import find_run

    passes = []
    real = lookup.iter_vectors
    monkeypatch.setattr(lookup, "iter_vectors", lambda *a, **k: passes.append(a) or real(*a, **k))
    rewritten = rerender(find_run(prov["run_id"], tmp_path / "wd"))
    assert rewritten["rows"] == len(rows) and len(passes) == 1
    again = pq.read_table(report_dir / "results.parquet").to_pylist()
    assert sorted(r["recall"] for r in again if r["stage"] == "query") == sorted(r["recall"] for r in queries)


def complete(point: PointPlan) -> bool:
    """Whether ``point`` is complete now (a plan's points read their state once, when first asked)."""
    return point_state(point.directory, point.key)[0]


def test_interrupted_sweep_resumes_at_its_first_unfinished_point(corpus: Path, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(base_config(corpus, tmp_path / "wd", vdb=vdb())))
    first, second = build_plan(load_config(path)).points
    # The second point cannot start: its directory's place holds a file (an interruption the run reports).
    second.directory.parent.mkdir(parents=True)
    second.directory.write_text("in the way\n")
    result = run_cli("run", str(path))
    assert result.returncode != 0
    assert complete(first) and not complete(second)
    done_at = (first.directory / "manifest.json").stat().st_mtime_ns
    failed = newest_provenance(tmp_path / "wd")
    assert failed["status"] == "failed"
    assert [t["label"] for t in failed["stages"]["vdb"]["tasks"]] == [first.label]
    shown = run_cli("status", failed["run_id"], "--workdir", str(tmp_path / "wd"))
    assert shown.returncode == 1, shown.stderr  # a failed run
    assert (
        "vdb points: 1 of 2 finished" in shown.stdout
        and f"{first.label}  repeat 0  succeeded" in shown.stdout
    )

    # What an interruption leaves of the second point (no manifest) is thrown away, not reused.
    second.directory.unlink()
    second.directory.mkdir()
    (second.directory / "left-over").write_text("partial\n")
    result = run_cli("run", str(path))
    assert result.returncode == 0, result.stderr[-4000:]
    resumed = newest_provenance(tmp_path / "wd")
    assert [t["label"] for t in resumed["stages"]["vdb"]["tasks"]] == [
        second.label
    ]  # only the unfinished one
    assert (first.directory / "manifest.json").stat().st_mtime_ns == done_at
    assert complete(second) and not (second.directory / "left-over").exists()
    rows = pq.read_table(Path(resumed["outputs"]["vdb"]) / "report" / "results.parquet").to_pylist()
    assert {r["label"] for r in rows if r["stage"] == "query"} == {first.label, second.label}

    # A point's manifest lists its raw files: one cut short later has the point measured again.
    listed = [f["file"] for f in json.loads((first.directory / "manifest.json").read_text())["files"]]
    raw = sorted(str(p.relative_to(first.directory)) for p in first.directory.glob("raw/*.parquet"))
    assert listed == raw
    assert listed and complete(first)
    os.truncate(first.directory / listed[0], 10)
    assert not complete(first)
    damage = f"{first.directory / listed[0]}: 10 bytes, manifest says"
    plan = run_cli("plan", str(path))
    assert plan.returncode == 0 and f"{damage}" in " ".join(plan.stderr.split()), plan.stderr
    vdb_row = next(line for line in plan.stdout.splitlines() if line.lstrip("│ ").startswith("vdb "))
    assert "partial" in vdb_row and "1 of 2 points done" in vdb_row, plan.stdout  # not "complete"
    wd = ["--workdir", str(tmp_path / "wd")]
    shown = run_cli("status", resumed["run_id"], *wd)  # the run the damaged point's results came from
    assert f"{first.label}  repeat 0  damaged" in shown.stdout and "partial 1/2" in shown.stdout, shown.stdout
    assert f"{second.label}  repeat 0  succeeded" in shown.stdout and damage in " ".join(shown.stderr.split())
    report = run_cli("report", resumed["run_id"], *wd)  # as plan names it, with the same remedy
    said = " ".join(report.stderr.split())
    assert report.returncode == 4 and f"point {first.label} (repeat 0): {damage}" in said, report.stderr
    assert "measures that point again" in said and "Traceback" not in said
    second_done_at = (second.directory / "manifest.json").stat().st_mtime_ns
    result = run_cli("run", str(path))
    assert result.returncode == 0, result.stderr[-4000:]
    said = " ".join(result.stderr.split())
    assert f"point 0 {first.label} is measured again" in said and damage in said, result.stderr
    assert f"point 1 {second.label} (repeat 0): done before" in said, result.stderr
    # named as the stage starts, not after the points it runs (and the bar's last line)
    assert said.index(f"point 1 {second.label} (repeat 0): done before") < said.index("vdb: 1/1 done")
    assert "vdb: 1/1 done (1 done before)" in said, result.stderr
    again = newest_provenance(tmp_path / "wd")
    assert [t["label"] for t in again["stages"]["vdb"]["tasks"]] == [first.label]
    assert complete(first) and (second.directory / "manifest.json").stat().st_mtime_ns == second_done_at

    # A raw file damaged inside, its size unchanged, is found too (by its sha256): measured again.
    listed = [f["file"] for f in json.loads((second.directory / "manifest.json").read_text())["files"]]
    damaged = second.directory / listed[0]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    sha_differs = f"{damaged}: sha256 differs from the manifest"
    assert point_state(second.directory, second.key) == (False, [sha_differs])
    plan = run_cli("plan", str(path))
    said = " ".join(plan.stderr.split())
    assert f"{sha_differs}: measured again by the next run" in said, plan.stderr
