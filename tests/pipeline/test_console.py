"""The console: the headline table a run ends with, ``report <run>`` (the report rewritten from the raw
results, no database started) and ``compare <run-a> <run-b>``, on one real small run of two sweep points
with Qdrant's embedded engine."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.config.loader import load_config
from pipeline.headline import seconds
from pipeline.plan import build_plan
from tests.conftest import REPO, run_cli
from tests.pipeline.conftest import LABELS


def headline_lines(stdout: str) -> dict[str, str]:
    """The table line of each label in a printed table."""
    return {label: next(line for line in stdout.splitlines() if label in line) for label in LABELS}


def without_timestamps(text: str) -> str:
    return re.sub(r"\d{8}T\d{6}Z", "<time>", text)


@pytest.mark.slow
def test_run_ends_with_the_headline_and_the_report_path(small_run) -> None:
    stdout = small_run["stdout"]
    assert "best QPS" in stdout and "upload (s)" in stdout and "index (s)" in stdout
    rows = pq.read_table(small_run["report"] / "results.parquet").to_pylist()
    for label, line in headline_lines(stdout).items():
        cells = [c.strip() for c in re.split(r"[│|]", line) if c.strip()]
        assert cells[0] == label
        mine = [r for r in rows if r["label"] == label]
        # the best QPS at recall >= 0.95 (the small sample reaches it: a QPS, not "none reaches")
        best = max((r for r in mine if r["stage"] == "query" and r["recall"] >= 0.95), key=lambda r: r["qps"])
        assert cells[1] == f"{best['qps']:,.1f}" and cells[2] == f"{best['recall']:.3f}"
        assert cells[3:6] == [str(best["ef"]), "8", "1"]  # its ef, batch, clients
        (insert,) = [r for r in mine if r["stage"] == "insert"]
        (index,) = [r for r in mine if r["stage"] == "index"]
        assert cells[6:8] == [seconds(insert["upload_s"]), seconds(index["index_s"])]
    assert f"report: {small_run['report'] / 'report.md'}" in stdout
    # Each point's phases are told as they start (a point runs minutes; the bar moves once per point).
    said = [line for line in small_run["stderr"].splitlines() if line.startswith("vdb: point 0 ")]
    phases = [line.split(": ")[2].split(" ")[0] for line in said]
    assert phases == ["deploy", "insert", "index", "query"], said
    assert re.search(r": insert \(\d[\d,]* rows, batch \d+\)$", said[1]), said


@pytest.mark.slow
def test_report_rewrites_the_same_report_from_the_raw_files(small_run) -> None:
    report = small_run["report"] / "report.md"
    before = report.read_text()
    report.write_text("stale\n")
    figures = sorted(p.name for p in small_run["report"].glob("*.png"))
    (small_run["report"] / "no_longer_drawn.png").write_bytes(b"stale")
    result = run_cli("report", small_run["run_dir"].name, "--workdir", str(small_run["workdir"]))
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in small_run["report"].glob("*.png")) == figures
    assert without_timestamps(report.read_text()) == without_timestamps(before)
    assert str(small_run["report"]) in result.stderr  # says where it wrote
    assert set(headline_lines(result.stdout)) == set(LABELS)
    # by its directory too, and the stage still verifies (its manifest lists the rewritten files)
    again = run_cli("report", str(small_run["run_dir"]))
    assert again.returncode == 0, again.stderr[-3000:]
    from core.store import complete_manifest

    assert complete_manifest(small_run["report"].parent) is not None


def compare_cells(stdout: str) -> dict[tuple[str, str], list[str]]:
    """(label, figure) -> [a, b, b/a] of a printed comparison."""
    cells, label = {}, None
    for line in stdout.splitlines():
        parts = [c.strip() for c in line.split("│")[1:-1]]
        if len(parts) != 5:
            continue
        label = parts[0] or label
        cells[(label, parts[1])] = parts[2:]
    return cells


@pytest.mark.slow
def test_compare_of_a_run_with_itself_gives_ratio_one(small_run) -> None:
    run = str(small_run["run_dir"])
    result = run_cli("compare", run, run)
    assert result.returncode == 0, result.stderr[-3000:]
    cells = compare_cells(result.stdout)
    for label in LABELS:
        for figure in ("best QPS", "upload (s)", "index (s)"):
            a, b, quotient = cells[(label, figure)]
            assert a == b != "—" and quotient == "1.00", (label, figure, cells[(label, figure)])
    assert "configuration: same dataset" in result.stdout
    assert "different datasets" not in result.stdout


@pytest.mark.slow
def test_compare_shows_ratios_and_the_differences_that_matter(small_run, tmp_path: Path) -> None:
    """Run b: a copy of the run whose results say twice the QPS, on another dataset and hnsw_m."""
    b_dir = tmp_path / "runs" / "run-b"
    shutil.copytree(small_run["run_dir"], b_dir, symlinks=True)
    rows = pq.read_table(small_run["report"] / "results.parquet").to_pylist()
    for row in rows:
        if row["stage"] == "query":
            row["qps"] *= 2
        if row["stage"] == "deploy" and row["label"] == LABELS[1]:
            params = json.loads(row["params"])
            params["collection"]["hnsw_m"] = 32
            row["params"] = json.dumps(params)
    (tmp_path / "vdb-b" / "report").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "vdb-b" / "report" / "results.parquet")
    prov = json.loads((b_dir / "provenance.json").read_text())
    prov["run_id"] = "run-b"
    prov["stages"]["vdb"]["directory"] = str(tmp_path / "vdb-b")
    prov["stages"]["embed"]["key"] = "another-dataset"
    prov["config"]["dataset"]["name"] = "other-corpus"
    k = prov["config"]["groundtruth"]["k"]
    prov["config"]["groundtruth"]["k"] = k + 10
    (b_dir / "provenance.json").write_text(json.dumps(prov))

    result = run_cli("compare", str(small_run["run_dir"]), "run-b", "--workdir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    cells = compare_cells(result.stdout)
    for label in LABELS:
        assert cells[(label, "best QPS")][2] == "2.00"
        assert cells[(label, "upload (s)")][2] == "1.00"
    assert "dataset key:" in result.stdout and "-> another-dataset" in result.stdout
    assert "dataset.name: pes2o-ve -> other-corpus" in result.stdout  # which dataset, not only its key
    said = " ".join(result.stdout.split())
    assert said.startswith("warning: a and b measured different datasets (pes2o-ve -> other-corpus)"), said
    assert f"groundtruth.k: {k} -> {k + 10}" in result.stdout  # why the ground truth key changed
    assert "-> None" not in result.stdout  # a field null in both is no difference
    assert f"{LABELS[1]}: collection.hnsw_m: 16 -> 32" in result.stdout
    assert f"{LABELS[0]}: collection.hnsw_m" not in result.stdout


@pytest.mark.slow
def test_compare_names_a_point_only_one_run_measured(small_run, tmp_path: Path) -> None:
    """Run b measured one of the two points: the comparison says so, not 'same ... point parameters'."""
    b_dir = tmp_path / "runs" / "run-b"
    shutil.copytree(small_run["run_dir"], b_dir, symlinks=True)
    rows = pq.read_table(small_run["report"] / "results.parquet").to_pylist()
    (tmp_path / "vdb-b" / "report").mkdir(parents=True)
    kept = [row for row in rows if row["label"] != LABELS[1]]
    pq.write_table(pa.Table.from_pylist(kept), tmp_path / "vdb-b" / "report" / "results.parquet")
    prov = json.loads((b_dir / "provenance.json").read_text())
    prov["run_id"] = "run-b"
    prov["stages"]["vdb"]["directory"] = str(tmp_path / "vdb-b")
    (b_dir / "provenance.json").write_text(json.dumps(prov))
    result = run_cli("compare", str(small_run["run_dir"]), "run-b", "--workdir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{LABELS[1]}: only in {small_run['run_dir'].name}" in result.stdout
    assert "configuration: same" not in result.stdout


@pytest.mark.slow
def test_unknown_run_is_a_clear_error(small_run) -> None:
    for command in (["report", "no-such-run"], ["compare", str(small_run["run_dir"]), "no-such-run"]):
        result = run_cli(*command, "--workdir", str(small_run["workdir"]))
        assert result.returncode != 0
        assert "no-such-run" in result.stderr and "Traceback" not in result.stderr + result.stdout


@pytest.mark.slow
def test_run_without_a_vdb_stage_is_a_clear_error(small_run, tmp_path: Path) -> None:
    copy = tmp_path / "runs" / "novdb"
    shutil.copytree(small_run["run_dir"], copy, symlinks=True)
    prov = json.loads((copy / "provenance.json").read_text())
    del prov["stages"]["vdb"]
    (copy / "provenance.json").write_text(json.dumps(prov))
    result = run_cli("report", "novdb", "--workdir", str(tmp_path))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "no vdb stage" in result.stderr and prov["run_id"] in result.stderr


@pytest.mark.slow
def test_report_of_a_run_recorded_before_points_were(small_run, tmp_path: Path) -> None:
    """A provenance without the point list (older runs): the complete stage's manifest lists the points."""
    copy = tmp_path / "runs" / "older"
    shutil.copytree(small_run["run_dir"], copy, symlinks=True)
    prov = json.loads((copy / "provenance.json").read_text())
    del prov["stages"]["vdb"]["points"]
    (copy / "provenance.json").write_text(json.dumps(prov))
    report = small_run["report"] / "report.md"
    before = report.read_text()
    result = run_cli("report", str(copy))
    assert result.returncode == 0, result.stderr[-3000:]
    assert set(headline_lines(result.stdout)) == set(LABELS)
    assert without_timestamps(report.read_text()) == without_timestamps(before)


@pytest.mark.slow
def test_report_names_a_missing_raw_file(small_run) -> None:
    prov = json.loads((small_run["run_dir"] / "provenance.json").read_text())
    point = Path(prov["stages"]["vdb"]["points"][-1]["directory"])
    raw = sorted((point / "raw").glob("*.parquet"))[0]
    kept = raw.with_name(raw.name + ".kept")
    raw.rename(kept)
    try:
        result = run_cli("report", str(small_run["run_dir"]))
    finally:
        kept.rename(raw)
    assert result.returncode != 0
    assert str(raw) in result.stderr and "missing" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.slow
def test_report_of_a_partly_finished_run(small_run) -> None:
    """A sweep that failed at its third point: the report is written from the two points it finished."""
    config = yaml.safe_load(small_run["config"].read_text())
    config["vdb"]["databases"][0]["default_segment_number"] = [1, 2, 3]
    path = small_run["config"].with_name("three.yaml")
    path.write_text(yaml.safe_dump(config))
    third = build_plan(load_config(path)).points[2]
    third.directory.parent.mkdir(parents=True, exist_ok=True)
    third.directory.write_text("in the way\n")  # the third point cannot start
    try:
        failed = run_cli("run", str(path))
    finally:
        third.directory.unlink()
    assert failed.returncode != 0 and "best QPS" not in failed.stdout
    runs = [p for p in (small_run["workdir"] / "runs").iterdir() if p != small_run["run_dir"]]
    (run_dir,) = [p for p in runs if json.loads((p / "provenance.json").read_text())["status"] == "failed"]
    shown = run_cli("status", str(run_dir))  # what it got to: the two points an earlier run measured
    assert shown.returncode == 1 and "vdb points: 2 of 3 finished" in shown.stdout, shown.stdout
    assert shown.stdout.count("succeeded (done before)") == 2 and "partial 2/3" in shown.stdout, shown.stdout
    result = run_cli("report", str(run_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    assert set(headline_lines(result.stdout)) == set(LABELS)  # the two reused points, not the third
    assert "default_segment_number=3" not in result.stdout
    report_dir = Path(json.loads((run_dir / "provenance.json").read_text())["stages"]["vdb"]["directory"])
    assert "default_segment_number=3" not in (report_dir / "report" / "report.md").read_text()
    assert (report_dir / "report" / "report.md").read_text().count("qdrant[default_segment_number=") > 2


def _rows(label: str, recalls: list[float], failed: str | None = None) -> list[dict]:
    common = {"database": "weaviate", "label": label, "repeat": 0}
    if failed:
        return [{**common, "stage": "deploy", "status": "failed", "error": failed}]
    rows = [
        {**common, "stage": "insert", "setting": "batch=64,clients=1", "upload_s": 12.5, "vectors": 10},
        {**common, "stage": "index", "index_s": 0.25},
    ]
    for ef, recall in zip((16, 64), recalls, strict=True):
        setting = f"ef={ef},batch=8,clients=2,k=10"
        rows.append(
            {**common, "stage": "query", "setting": setting, "ef": ef, "batch_size": 8, "clients": 2}
            | {"k": 10, "qps": 1000.0 / ef, "recall": recall}
        )
    return rows


def test_headline_says_none_reaches_and_why_a_point_has_no_figures() -> None:
    from rich.console import Console

    from apps.evaluate.results import normalize_rows
    from apps.report.document import summarize
    from pipeline.headline import headline_table

    rows = normalize_rows(
        _rows("weaviate[a]", [0.9, 0.97])
        + _rows("weaviate[b]", [0.5, 0.8])
        + _rows("weaviate[c]", [], failed="server did not start")
    )
    console = Console(record=True, width=200)
    console.print(headline_table(summarize(rows)))
    text = console.export_text()
    cells = {
        parts[0]: parts[1:]
        for line in text.splitlines()
        if len(parts := [c.strip() for c in line.split("│")[1:-1]]) == 8 and parts[0]
    }
    # a: the best QPS at recall >= 0.95 is ef=64 (ef=16 is faster but below 0.95)
    assert cells["weaviate[a]"] == ["15.6", "0.970", "64", "8", "2", "12.5", "0.250"]
    # b: nothing reaches 0.95; the highest recall is shown, at its setting
    assert cells["weaviate[b]"] == ["none reaches 0.95", "0.800", "64", "8", "2", "12.5", "0.250"]
    assert cells["weaviate[c]"][0] == "failed: deploy: server did not start"
    assert cells["weaviate[c]"][1:] == ["—"] * 6


def test_progress_lines_count_items_only_where_a_stage_has_them() -> None:
    """A log (no terminal) gets one line per finished task; the database stage counts points, whose
    bar is the count itself: no "1 items 0.0/s". A task reused from an earlier run counts apart."""
    import io

    from rich.console import Console

    from pipeline.progress import StageProgress

    out = io.StringIO()
    with StageProgress(Console(file=out, width=200)) as progress:
        progress.add_stage("embed", 2)
        progress.add_stage("vdb", 3)
        progress.advance("embed", 1048)
        progress.phase("vdb", "point 0 qdrant: index")
        progress.advance("vdb")
        # Reused from an earlier run: off the bar (its rate and ETA are the new work's), counted apart.
        progress.add_stage("chunk", 3)
        progress.advance("chunk", 500, reused=True)
        progress.advance("chunk", 20)
    embed, phase, vdb, chunk = out.getvalue().splitlines()
    assert phase == "vdb: point 0 qdrant: index"
    assert embed.startswith("embed: 1/2 done, 1,048 items ") and "/s" in embed, embed
    assert vdb.startswith("vdb: 1/3 done") and "items" not in vdb and "/s" not in vdb, vdb
    assert chunk.startswith("chunk: 1/2 done (1 done before), 20 items "), chunk


def test_the_eta_weighs_points_by_their_expected_time_and_outlasts_long_tasks(monkeypatch) -> None:
    """Three points expected to take 10, 10 and 80 s: after the first (10 s) 90 s are left, not the 20 s a
    mean per point gives. A point of ten minutes keeps the ETA (rich's 30 s window lost it), and a point
    reused from an earlier run leaves its expected time out of the rest."""
    import io

    from rich.console import Console

    from pipeline import progress as progress_module
    from pipeline.progress import StageProgress

    clock = [1000.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    with StageProgress(Console(file=out, width=200)) as progress:
        progress.add_stage("vdb", 4, expected_s=400.0)
        progress.advance("vdb", reused=True, expected_s=300.0)  # done before: 100 s of work left
        clock[0] += 10
        progress.advance("vdb", expected_s=10.0)
        clock[0] += 600  # the second point takes ten minutes, not its expected 10 s
        progress.advance("vdb", expected_s=10.0)
        clock[0] += 5
        progress.advance("vdb", dropped_s=80.0)  # failed in 5 s: its 80 s are not done, nor left
        progress.add_stage("embed", 4)  # no expected times: by tasks done, the mean since the start
        clock[0] += 30
        progress.advance("embed", 8)
    first, second, last, embed = out.getvalue().splitlines()
    assert first.startswith("vdb: 1/3 done (1 done before)") and first.endswith("ETA 90 s"), first
    assert second.startswith("vdb: 2/3 done") and second.endswith("ETA 41 min"), second  # 80 x 610/20 s
    assert "ETA" not in last, last
    assert embed.endswith("ETA 90 s"), embed


@pytest.mark.slow
def test_a_failed_teardown_is_said_and_recorded(small_run) -> None:
    """A point whose stop fails keeps its figures, but the console says so (its server or pilot job may
    outlive it) and the run's provenance records it. FAISS's stop is made to fail in the driver."""
    import os
    import subprocess
    import sys

    config = yaml.safe_load(small_run["config"].read_text())
    config["vdb"]["databases"] = [{"name": "faiss"}]
    path = small_run["config"].with_name("teardown.yaml")
    path.write_text(yaml.safe_dump(config))
    code = (
        "import runpy, sys\n"
        "from apps.vdb.faiss.deploy import FaissDeployment\n"
        "def stop(self):\n"
        "    raise RuntimeError('port 6333 still bound')\n"
        "FaissDeployment.stop = stop\n"
        f"sys.argv = ['pipeline', 'run', {str(path)!r}]\n"
        "runpy.run_module('pipeline', run_name='__main__', alter_sys=True)\n"
    )
    env = {**os.environ, "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]  # the figures stand
    said = " ".join((result.stdout + result.stderr).split())
    assert "teardown failed: RuntimeError: port 6333 still bound; its server or job may still run" in said, (
        said
    )
    (run_dir,) = [
        p
        for p in (small_run["workdir"] / "runs").iterdir()
        if json.loads((p / "provenance.json").read_text())["config"]["vdb"]["databases"][0]["name"] == "faiss"
    ]
    tasks = json.loads((run_dir / "provenance.json").read_text())["stages"]["vdb"]["tasks"]
    assert tasks, "the faiss point ran"
    assert [t["teardown_error"] for t in tasks if "teardown_error" in t] == [
        "faiss: teardown failed: RuntimeError: port 6333 still bound"
    ] * len(tasks)
