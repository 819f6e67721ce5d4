"""Telemetry of pilot ranks: the rank scripts' sampler lines, the standalone sampler with its rank label,
and the driver's merge of the ranks' files with phases assigned by the driver's switch times."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apps.telemetry.collector import DatabaseTelemetry, merge_rank_files, phase_at
from apps.telemetry.sampler import TELEMETRY_SCHEMA
from apps.vdb.cluster.layout import node_shape, plan_cluster
from apps.vdb.cluster.render import render_files
from apps.vdb.sweep import SweepPoint
from core.store import write_parquet_atomic
from pipeline.config.loader import load_config
from tests.conftest import REPO
from tests.pipeline.test_hpc_render import fixed_env  # noqa: F401  (a fixture used below)


def _row(t: float, **values: object) -> dict[str, object]:
    row = {f.name: None for f in TELEMETRY_SCHEMA}
    row.update(time=t, phase="run", node="n0", process="rank-000", pid=7, role="server", rank=0)
    row.update(values)
    return row


def _write(path: Path, rows: list[dict[str, object]]) -> None:
    write_parquet_atomic(pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA), path)


def test_phase_at_takes_the_last_switch_at_or_before_each_time() -> None:
    switches = [(10.0, "deploy"), (20.0, "insert"), (30.0, "query"), (40.0, "teardown")]
    times = [5.0, 10.0, 19.9, 20.0, 35.0, 40.0, 99.0]
    assert phase_at(switches, times) == [
        "deploy",
        "deploy",
        "deploy",
        "insert",
        "query",
        "teardown",
        "teardown",
    ]
    with pytest.raises(ValueError, match="no phase switches"):
        phase_at([], [1.0])


def test_merge_labels_rank_rows_by_time_and_keeps_node_and_rank(tmp_path: Path) -> None:
    out = tmp_path / "telemetry.parquet"
    _write(out, [_row(11.0, node="driver", process="local", pid=1, rank=None)])  # the driver's own row
    files = tmp_path / "telemetry"
    _write(files / "rank-000.parquet", [_row(12.0), _row(21.0), _row(41.0)])
    _write(
        files / "rank-001.parquet",
        [_row(25.0, node="n1", rank=1, process="rank-001"), _row(31.0, node="n1", rank=1, role="child")],
    )
    (files / "rank-002.parquet").write_text("not parquet")  # left out with a warning, never raised
    switches = [(10.0, "deploy"), (20.0, "insert"), (30.0, "query"), (40.0, "teardown")]
    added = merge_rank_files(out, sorted(files.glob("rank-*.parquet")), switches)
    assert added == 5
    table = pq.read_table(out)
    assert table.schema.equals(TELEMETRY_SCHEMA, check_metadata=False)
    rows = [(r["time"], r["phase"], r["node"], r["rank"], r["role"]) for r in table.to_pylist()]
    assert rows == [
        (11.0, "run", "driver", None, "server"),  # the driver's rows keep the phase they were taken in
        (12.0, "deploy", "n0", 0, "server"),
        (21.0, "insert", "n0", 0, "server"),
        (25.0, "insert", "n1", 1, "server"),
        (31.0, "query", "n1", 1, "child"),
        (41.0, "teardown", "n0", 0, "server"),
    ]


def test_database_telemetry_merges_rank_files_after_stop(tmp_path: Path) -> None:
    rank_file = tmp_path / "cluster" / "telemetry" / "rank-003.parquet"
    telemetry = DatabaseTelemetry(tmp_path, dict, interval=0.2, rank_files=lambda: [rank_file])
    telemetry.start()
    telemetry.phase("insert")
    time.sleep(0.05)  # the two switches must be apart for a row to fall between them
    telemetry.phase("teardown")
    (insert, _), (teardown, _) = telemetry.switches[-2:]
    assert teardown > insert
    _write(rank_file, [_row(insert - 0.001, rank=3), _row((insert + teardown) / 2, rank=3)])
    telemetry.stop()
    rows = pq.read_table(tmp_path / "telemetry.parquet").to_pylist()
    assert [(r["phase"], r["rank"]) for r in rows] == [("deploy", 3), ("insert", 3)]
    assert [p for _, p in telemetry.switches] == ["deploy", "insert", "teardown"]


def test_standalone_sampler_labels_rows_with_rank_and_node(tmp_path: Path) -> None:
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    out = tmp_path / "rank-004.parquet"
    try:
        cmd = [
            "--pids",
            str(server.pid),
            "--out",
            str(out),
            "--interval",
            "0.2",
            "--rank",
            "4",
            "--node",
            "x9",
        ]
        sampler = subprocess.run(
            [sys.executable, "-m", "apps.telemetry.sampler", *cmd],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.kill()
        server.wait()
    assert sampler.returncode == 0, sampler.stderr  # it ended by itself once the server had exited
    rows = pq.read_table(out).to_pylist()
    assert len(rows) >= 2
    assert {(r["rank"], r["node"], r["process"], r["role"], r["pid"]) for r in rows} == {
        (4, "x9", "rank-004", "server", server.pid)
    }


def test_standalone_sampler_stops_when_the_rank_shell_exits(tmp_path: Path) -> None:
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    shell = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])  # the rank's shell
    out = tmp_path / "rank-000.parquet"
    try:
        args = ["--pids", str(server.pid), "--out", str(out), "--interval", "0.2", "--rank", "0"]
        sampler = subprocess.run(
            [sys.executable, "-m", "apps.telemetry.sampler", *args, "--while-alive", str(shell.pid)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert server.poll() is None  # the server still runs: the sampler ended with its rank's shell
    finally:
        for proc in (server, shell):
            proc.kill()
            proc.wait()
    assert sampler.returncode == 0, sampler.stderr
    assert pq.read_table(out).num_rows >= 2


@pytest.mark.usefixtures("fixed_env")
@pytest.mark.parametrize("platform", ["polaris", "aurora"])
def test_rank_scripts_start_the_sampler_only_when_enabled(platform: str) -> None:
    cfg = load_config(REPO / "configs" / f"{platform}.yaml").config
    node = node_shape(cfg.executor)
    settings = cfg.vdb.databases[0]
    cluster = cfg.vdb.cluster.for_database(settings.name)
    off = cluster.model_copy(update={"telemetry": False})
    layout = plan_cluster(settings, cluster, node, Path("/w"), REPO)
    on_files = render_files(layout, cluster)
    off_files = render_files(layout, off)
    for r in layout.ranks:
        name = f"ranks/rank-{r.rank:03d}.sh"
        added = [line for line in on_files[name].splitlines() if line not in off_files[name].splitlines()]
        assert added == [
            f"VDB_TELEMETRY=/w/cluster/telemetry/rank-{r.rank:03d}.parquet",
            f"VDB_PYTHON={sys.executable}",
        ]
        # Off: nothing else differs, so lib.sh's vdb_telemetry_start finds VDB_TELEMETRY unset.
        assert [line for line in on_files[name].splitlines() if line not in added] == off_files[
            name
        ].splitlines()
        assert "VDB_TELEMETRY" not in off_files[name]


@pytest.mark.usefixtures("fixed_env")
def test_switching_rank_telemetry_keeps_every_point_key() -> None:
    from pipeline.sweep import point_params

    def with_cluster(point: SweepPoint, **changes: object) -> SweepPoint:
        cfg = point.config
        return replace(
            point, config=cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update=changes)})
        )

    points = load_config(REPO / "configs" / "polaris.yaml").config.vdb.points
    assert points and all(p.config.cluster.telemetry for p in points)
    for point in points:
        params = point_params(point, "cosine")
        assert point_params(with_cluster(point, telemetry=False), "cosine") == params
        assert point_params(with_cluster(point, cores_per_worker=3), "cosine") != params  # a setting counts
