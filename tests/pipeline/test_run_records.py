"""A run read back (pipeline/runs.py) by ``status``, ``report`` and ``compare``: found by id or directory
the same way, and a damaged record (provenance, the vdb stage's manifest, a point's outcome) is one line
``error: ...`` naming the file and its first bad field, exit 4, never a traceback.

Each damaged run is a copy of one real small run (two Qdrant points, embedded engine) with one thing
broken.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.errors import ArtifactError
from core.watchdog import create_time
from pipeline.runs import find_run
from tests.conftest import run_cli

DAMAGED = 4  # core.errors.ArtifactError


def copy_run(small_run: dict[str, Path], workdir: Path, name: str, edit: Callable[[dict], Any]) -> Path:
    """``<workdir>/runs/<name>``: a copy of the real run whose provenance ``edit`` changed (or replaced:
    what it returns, unless None)."""
    run_dir = workdir / "runs" / name
    shutil.copytree(small_run["run_dir"], run_dir, symlinks=True)
    prov = json.loads((run_dir / "provenance.json").read_text())
    changed = edit(prov)
    (run_dir / "provenance.json").write_text(json.dumps(prov if changed is None else changed))
    return run_dir


def copy_vdb_stage(small_run: dict[str, Path], workdir: Path) -> Path:
    """A copy of the run's vdb stage directory (its manifest, report and point links) under ``workdir``."""
    prov = json.loads((small_run["run_dir"] / "provenance.json").read_text())
    source = Path(prov["stages"]["vdb"]["directory"])
    copy = workdir / "store" / "vdb" / source.name
    shutil.copytree(source, copy, symlinks=True)
    return copy


def assert_one_line_error(result, *names: str) -> str:
    """Exit 4, no traceback, and stderr is one ``error:`` line naming each of ``names``."""
    both = result.stdout + result.stderr
    assert "Traceback" not in both and "errors.pydantic.dev" not in both, both[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert result.returncode == DAMAGED, (result.returncode, lines[0])
    return lines[0]


def commands(small_run: dict[str, Path], name: str, workdir: Path) -> list[list[str]]:
    """Every command that reads the run ``name`` (an id under ``workdir``)."""
    options = ["--workdir", str(workdir)]
    return [
        ["report", name, *options],
        ["compare", str(small_run["run_dir"]), name, *options],
        ["status", name, *options],
    ]


def _point_without(field: str) -> Callable[[dict], None]:
    def edit(prov: dict) -> None:
        del prov["stages"]["vdb"]["points"][0][field]

    return edit


def _set_stages(value: Any) -> Callable[[dict], None]:
    def edit(prov: dict) -> None:
        prov["stages"] = value

    return edit


def _null_vdb(prov: dict) -> None:
    prov["stages"]["vdb"] = None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (_point_without("repeat"), "stages.vdb.points.0.repeat"),
        (_point_without("key"), "stages.vdb.points.0.key"),
        (_set_stages([]), "stages"),
        (_null_vdb, "stages.vdb"),
        (lambda prov: [], "expected a JSON object, got a list"),
    ],
    ids=["point-without-repeat", "point-without-key", "stages-a-list", "vdb-stage-null", "not-an-object"],
)
def test_a_damaged_provenance_is_one_line_naming_the_field(
    small_run, tmp_path: Path, edit, field: str
) -> None:
    run_dir = copy_run(small_run, tmp_path, "damaged", edit)
    messages = set()
    for command in commands(small_run, "damaged", tmp_path):
        result = run_cli(*command)
        messages.add(assert_one_line_error(result, str(run_dir / "provenance.json"), field))
    assert len(messages) == 1  # every command says the same


@pytest.mark.slow
@pytest.mark.parametrize(
    ("manifest", "field"),
    [
        (None, "expected a JSON object, got null"),
        ({"points": [{"label": "a", "repeat": 0}]}, "points.0.key"),
        ({"points": {"label": "a"}}, "points"),
    ],
    ids=["null", "point-without-key", "points-not-a-list"],
)
def test_a_damaged_vdb_stage_manifest_is_one_line_naming_the_field(
    small_run, tmp_path: Path, manifest: Any, field: str
) -> None:
    """A run recorded before points were: the vdb stage's manifest lists them."""
    stage = copy_vdb_stage(small_run, tmp_path)
    (stage / "manifest.json").write_text(json.dumps(manifest))

    def edit(prov: dict) -> None:
        del prov["stages"]["vdb"]["points"]
        prov["stages"]["vdb"]["directory"] = str(stage)

    copy_run(small_run, tmp_path, "older", edit)
    for command in commands(small_run, "older", tmp_path):
        assert_one_line_error(run_cli(*command), str(stage / "manifest.json"), field)


def _with_empty_point_manifest(small_run: dict[str, Path], workdir: Path) -> tuple[Path, Path]:
    """A copy of the run whose first point's ``manifest.json`` is ``{}``; (its run dir, that manifest)."""
    prov = json.loads((small_run["run_dir"] / "provenance.json").read_text())
    point = workdir / "store" / "vdb-points" / "damaged-point"
    shutil.copytree(prov["stages"]["vdb"]["points"][0]["directory"], point, symlinks=True)
    (point / "manifest.json").write_text("{}")

    def edit(prov: dict) -> None:
        prov["stages"]["vdb"]["points"][0]["directory"] = str(point)

    return copy_run(small_run, workdir, "emptypoint", edit), point / "manifest.json"


@pytest.mark.slow
def test_a_point_outcome_of_an_empty_object_names_the_file_and_first_field(small_run, tmp_path: Path) -> None:
    run_dir, manifest = _with_empty_point_manifest(small_run, tmp_path)
    record = find_run(str(run_dir))
    with pytest.raises(ArtifactError) as raised:
        record.outcome(record.points[0])
    message = str(raised.value)
    assert "\n" not in message and "errors.pydantic.dev" not in message
    assert str(manifest) in message and "database: Field required" in message


@pytest.mark.slow
def test_report_of_a_point_outcome_of_an_empty_object_is_one_line(small_run, tmp_path: Path) -> None:
    _, manifest = _with_empty_point_manifest(small_run, tmp_path)
    result = run_cli("report", "emptypoint", "--workdir", str(tmp_path))
    assert_one_line_error(result, str(manifest), "database: Field required")


@pytest.mark.slow
def test_status_finds_a_run_id_as_report_does(small_run, tmp_path: Path) -> None:
    run_id = small_run["run_dir"].name
    by_env = run_cli("status", run_id, env={"PIPELINE_WORKDIR": str(small_run["workdir"])})
    by_option = run_cli("status", run_id, "--workdir", str(small_run["workdir"]))
    by_directory = run_cli("status", str(small_run["run_dir"]))
    for result in (by_env, by_option, by_directory):
        assert result.returncode == 0, result.stderr[-3000:]
        assert run_id in result.stdout and "succeeded" in result.stdout and "complete" in result.stdout
    assert by_env.stdout == by_option.stdout == by_directory.stdout
    unknown = run_cli("status", "no-such-run", env={"PIPELINE_WORKDIR": str(small_run["workdir"])})
    assert unknown.returncode == 2 and "no-such-run" in unknown.stderr and run_id in unknown.stderr
    assert "Traceback" not in unknown.stderr


@pytest.mark.slow
def test_an_unreadable_provenance_is_exit_4_for_every_command(small_run, tmp_path: Path) -> None:
    run_dir = copy_run(small_run, tmp_path, "badjson", lambda prov: None)
    (run_dir / "provenance.json").write_text("{bad json")
    messages = {
        assert_one_line_error(run_cli(*command), str(run_dir / "provenance.json"), "not JSON")
        for command in [*commands(small_run, "badjson", tmp_path), ["status", str(run_dir)]]
    }
    assert len(messages) == 1


@pytest.mark.slow
def test_status_tells_a_run_whose_driver_died_from_one_running(small_run, tmp_path: Path) -> None:
    """A run killed with SIGKILL leaves ``status: running`` in its provenance; `status` read it as running
    forever. Its driver's pid and start (recorded with the host) say whether it still runs: ``lost``, as
    the Globus Compute status says of a driver gone."""

    def running_as(pid: int) -> Callable[[dict], None]:
        driver = [pid, create_time(pid)]
        return lambda prov: prov.update(status="running", driver=driver, host=socket.gethostname())

    alive = subprocess.Popen(["sleep", "30"])
    try:
        live = run_cli("status", str(copy_run(small_run, tmp_path, "live", running_as(alive.pid))))
        killed = copy_run(small_run, tmp_path, "killed", running_as(alive.pid))
    finally:
        alive.kill()
        alive.wait()
    assert "status running" in live.stdout and "lost" not in live.stdout, live.stdout
    lost = run_cli("status", str(killed))  # the same driver, now gone
    assert live.returncode == 0, live.stderr
    assert lost.returncode == 1, lost.stderr  # as `status --endpoint` exits for a lost run
    assert "status lost" in lost.stdout
    assert f"its driver (pid {alive.pid}) is gone without finishing" in lost.stdout


@pytest.mark.slow
def test_a_run_stopped_part_way_does_not_replace_the_complete_stages_report(
    small_run, tmp_path: Path
) -> None:
    """Runs of one content key share the vdb stage and its report: ``report`` of a run stopped after its
    first point, once a later run completed the stage, is refused naming that run; the report stays whole."""
    stage = copy_vdb_stage(small_run, tmp_path)

    def completed(prov: dict) -> None:
        prov["run_id"], prov["stages"]["vdb"]["directory"] = "whole", str(stage)

    def stopped(prov: dict) -> None:
        completed(prov)
        prov["run_id"], prov["status"] = "stopped", "interrupted"
        del prov["stages"]["vdb"]["points"][1:]

    copy_run(small_run, tmp_path, "whole", completed)
    copy_run(small_run, tmp_path, "stopped", stopped)
    before = (stage / "report" / "results.parquet").read_bytes()
    line = assert_one_line_error(
        run_cli("report", "stopped", "--workdir", str(tmp_path)), "1 of the 2 points"
    )
    assert "`python -m pipeline report whole` rewrites it" in line
    assert (stage / "report" / "results.parquet").read_bytes() == before
    rewritten = run_cli("report", "whole", "--workdir", str(tmp_path))
    assert rewritten.returncode == 0 and "from 2 point(s)" in rewritten.stdout + rewritten.stderr, (
        rewritten.stderr
    )
