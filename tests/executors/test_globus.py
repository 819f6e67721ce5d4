"""Remote triggering: what ``submit``/``status`` send survives Globus Compute's serializer and really runs.

The Globus service cannot be reached here, so the functions go through the same serializer the SDK uses
(``globus_compute_sdk.serialize.ComputeSerializer``) and then through a local ``ProcessPoolExecutor``,
which, like the Globus Compute ``Executor``, is a ``concurrent.futures.Executor``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from executors.globus import read_status, remote_status, start_run, submit_run, wait_for
from tests.conftest import REPO, base_config, sample_records, write_jsonl

ENDPOINT = "4b116d3c-1703-4f8f-9f6f-39921e5864df"  # an endpoint id has the form of a UUID

serialize = pytest.importorskip("globus_compute_sdk.serialize")


class SerializingExecutor(Executor):
    """Sends every call through ComputeSerializer (as the Globus Compute Executor does) before running it."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.serializer = serialize.ComputeSerializer()
        self.payloads: list[str] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:
        packed = self.serializer.pack_buffers(
            [
                self.serializer.serialize(fn),
                self.serializer.serialize(args),
                self.serializer.serialize(kwargs),
            ]
        )
        self.payloads.append(packed)
        fn2, args2, kwargs2 = self.serializer.unpack_and_deserialize(packed)
        return self.inner.submit(fn2, *args2, **kwargs2)

    def shutdown(self, wait: bool = True, **kwargs: Any) -> None:
        self.inner.shutdown(wait=wait)


def tiny_config(tmp_path: Path) -> str:
    """20 real abstracts, MiniLM, no vector databases: the smallest real run, as YAML text."""
    corpus = write_jsonl(tmp_path / "corpus" / "tiny.jsonl", sample_records(20))
    config = base_config(corpus, tmp_path / "work")
    config["name"] = "globus-test"
    return yaml.safe_dump(config, sort_keys=False)


@pytest.mark.parametrize("strategy", [None, "DillCodeSource", "DillCodeTextInspect"])
def test_functions_and_arguments_survive_the_compute_serializer(strategy: str | None) -> None:
    from globus_compute_sdk.serialize import concretes

    code = getattr(concretes, strategy)() if strategy else None
    serializer = serialize.ComputeSerializer(strategy_code=code)
    args = ("name: x\n", None, "/remote/repo", None, {"ACCOUNT": "MyProject"}, 300.0)
    for fn in (start_run, read_status):
        payload = serializer.serialize(fn)
        restored = serializer.deserialize(payload)
        assert callable(restored) and restored.__name__ == fn.__name__
    # read_status runs as shipped (imports inside it, nothing from this module's namespace)
    shipped = serializer.deserialize(serializer.serialize(read_status))
    assert shipped(None, "r-20260101T000000Z-abc", "/nonexistent-checkout")["status"] == "unknown"
    assert serializer.deserialize(serializer.serialize(args)) == args
    restored_result = serializer.deserialize(serializer.serialize({"run_id": "r", "pid": 1, "stages": {}}))
    assert restored_result == {"run_id": "r", "pid": 1, "stages": {}}


def test_status_of_a_run_that_does_not_exist(tmp_path: Path) -> None:
    status = read_status(str(tmp_path), "nope-20260101T000000Z-abc")
    assert status["status"] == "unknown"
    assert str(tmp_path / "runs" / "nope-20260101T000000Z-abc" / "provenance.json") in status["error"]


def _finished_run(workdir: Path, run_id: str) -> Path:
    run_dir = workdir / "runs" / run_id
    run_dir.mkdir(parents=True)
    record = {"run_id": run_id, "status": "succeeded", "stages": {}}
    (run_dir / "provenance.json").write_text(json.dumps(record))
    return run_dir


def test_status_by_id_alone_finds_a_submitted_run(tmp_path: Path) -> None:
    """``status --endpoint E <run-id>`` as the docs write it: the checkout's record of submitted runs says
    where the run lives; a run id it does not know is an error saying what to give instead."""
    run_dir = _finished_run(tmp_path / "project" / "wd", "r-20260101T000000Z-abc")
    repo = tmp_path / "checkout"
    (repo / ".submit" / "runs").mkdir(parents=True)  # as start_run leaves it
    (repo / ".submit" / "runs" / f"{run_dir.name}.json").write_text(json.dumps({"run_dir": str(run_dir)}))
    found = read_status(None, run_dir.name, repo_dir=str(repo))
    assert found["status"] == "succeeded" and found["run_dir"] == str(run_dir)
    missing = read_status(None, "other-20260101T000000Z-abc", repo_dir=str(repo))
    assert missing["status"] == "unknown"
    assert "no run other-20260101T000000Z-abc was submitted from" in missing["error"]
    assert "--workdir" in missing["error"]


def test_status_expands_the_workdir_on_the_remote_side(tmp_path: Path, monkeypatch) -> None:
    """The docs quote ``--workdir '${PROJECT_DIR}/pes2o-ve'`` so that the remote side expands it."""
    run_dir = _finished_run(tmp_path / "project" / "pes2o-ve", "r-20260101T000000Z-abc")
    monkeypatch.setenv("PROJECT_DIR", str(tmp_path / "project"))
    assert read_status("${PROJECT_DIR}/pes2o-ve", run_dir.name)["status"] == "succeeded"
    monkeypatch.delenv("PROJECT_DIR")
    unset = read_status("${PROJECT_DIR}/pes2o-ve", run_dir.name)
    assert unset["status"] == "unknown" and "$PROJECT_DIR is not set" in unset["error"]
    monkeypatch.setenv("PIPELINE_WORKDIR", str(tmp_path / "elsewhere"))  # the fallback, named as such
    missing = read_status(None, run_dir.name, repo_dir=str(tmp_path / "checkout"))
    assert missing["status"] == "unknown" and "(from $PIPELINE_WORKDIR)" in missing["error"]


def test_status_command_says_a_remote_run_is_not_found_in_one_line(tmp_path: Path, monkeypatch) -> None:
    """The command, with a local executor standing in for the endpoint: a run the remote side cannot
    find, or a remote error, is one ``error:`` line and a non-zero exit, no traceback."""
    from concurrent.futures import ThreadPoolExecutor

    from typer.testing import CliRunner

    import executors.globus
    from pipeline.cli.main import app

    monkeypatch.setattr(executors.globus, "compute_executor", lambda endpoint_id, **kw: ThreadPoolExecutor(1))
    monkeypatch.setenv("PES2O_REPO", str(tmp_path))
    monkeypatch.delenv("PIPELINE_WORKDIR", raising=False)
    result = CliRunner().invoke(app, ["status", "--endpoint", ENDPOINT, "r-20260101T000000Z-abc"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: status --endpoint {ENDPOINT} r-20260101T000000Z-abc: no run")
    assert result.output.count("\n") == 1, result.output  # one line (the console does not wrap it)
    assert result.exception is None or isinstance(result.exception, SystemExit)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("endpoint offline")

    monkeypatch.setattr(executors.globus, "read_status", broken)
    result = CliRunner().invoke(app, ["status", "--endpoint", ENDPOINT, "r-20260101T000000Z-abc"])
    assert result.exit_code == 1, result.output
    assert result.output == f"error: status through endpoint {ENDPOINT}: OSError: endpoint offline\n", (
        result.output
    )


def test_submit_checks_what_it_can_before_signing_in(tmp_path: Path, monkeypatch) -> None:
    """An endpoint id that is no UUID, a file that is no YAML, or a --dataset the file does not have is
    refused here, at once (exit 2, one line), not after a Globus sign-in and a remote start."""
    from typer.testing import CliRunner

    import executors.globus
    from pipeline.cli.main import app

    def no_sign_in(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the Globus service was reached")

    monkeypatch.setattr(executors.globus, "compute_executor", no_sign_in)
    good = REPO / "configs" / "local-ann.yaml"
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nvdb: [unclosed\n")
    cases = [
        (["--endpoint", "not-a-uuid", str(good)], "'not-a-uuid' is not an endpoint id"),
        (["--endpoint", ENDPOINT, str(broken)], f"{broken}:"),
        (["--endpoint", ENDPOINT, str(good), "--dataset", "glove"], "--dataset 'glove': not an entry"),
    ]
    for args, said in cases:
        result = CliRunner().invoke(app, ["submit", *args])
        assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
    # the file's own dataset by its name, and ALL in capitals, pass the check (and reach the service)
    for dataset in ("fmnist1k", "ALL"):
        result = CliRunner().invoke(app, ["submit", "--endpoint", ENDPOINT, str(good), "--dataset", dataset])
        assert "the Globus service was reached" in result.output, result.output


def test_status_marks_a_dead_driver_as_lost(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "provenance.json").write_text(json.dumps({"run_id": "r1", "status": "running", "stages": {}}))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    (run_dir / "submit.json").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    status = read_status(None, str(run_dir))
    assert status["status"] == "lost" and status["alive"] is False
    # Days later its pid is another process's (here: this one's): the start time recorded at submit tells
    import os

    with open(f"/proc/{os.getpid()}/stat") as fh:
        ours = fh.read().rsplit(")", 1)[1].split()[19]
    record = {"pid": os.getpid(), "host": socket.gethostname(), "pid_start": str(int(ours) + 1)}
    (run_dir / "submit.json").write_text(json.dumps(record))
    assert read_status(None, str(run_dir))["status"] == "lost"
    (run_dir / "submit.json").write_text(json.dumps({**record, "pid_start": ours}))
    assert read_status(None, str(run_dir))["status"] == "running"


def test_submit_reports_a_config_error_with_the_log(tmp_path: Path) -> None:
    with ProcessPoolExecutor(1) as pool, pytest.raises(RuntimeError) as err:
        submit_run(pool, config_text="name: broken\n", repo_dir=str(tmp_path), wait_s=60)
    assert "exited (code 2)" in str(err.value) and "corpus" in str(err.value)


def test_submit_passes_the_dataset_entry_to_the_remote_run(tmp_path: Path) -> None:
    """``submit --dataset NAME`` runs that entry remotely: a name the config lacks ends the remote run
    with the loader's message, which comes back in the error."""
    text = (REPO / "configs" / "local-ann.yaml").read_text()
    with ProcessPoolExecutor(1) as pool, pytest.raises(RuntimeError) as err:
        submit_run(pool, config_text=text, repo_dir=str(tmp_path), wait_s=60, dataset="glove; rm -rf /")
    message = " ".join(str(err.value).split())
    assert "exited (code 2)" in message
    assert "--dataset 'glove; rm -rf /': not an entry of the config's datasets section" in message


def test_submit_needs_exactly_one_config() -> None:
    with pytest.raises(ValueError):
        submit_run(ProcessPoolExecutor(1), repo_dir=".")


@pytest.mark.slow
def test_submit_runs_a_small_pipeline_and_status_reports_it_finished(tmp_path: Path) -> None:
    repo = tmp_path / "checkout"  # stands for the remote clone: the config lands in its configs/
    repo.mkdir()
    text = tiny_config(tmp_path)
    record: dict[str, Any] = {}
    with ProcessPoolExecutor(1) as pool:
        remote = SerializingExecutor(pool)
        try:
            record = submit_run(remote, config_text=text, repo_dir=str(repo), wait_s=120)
            assert record["run_id"].startswith("globus-test-")
            assert Path(record["config"]).parent == repo / "configs"
            status = wait_for(remote, str(tmp_path / "work"), record["run_id"], timeout=600, poll_s=2)
        finally:
            if record.get("pid"):
                _stop_if_running(int(record["pid"]))
        assert status["status"] == "succeeded", Path(record["log"]).read_text()[-3000:]
        assert {"shard", "chunk", "embed", "queries", "groundtruth"} <= set(status["stages"])
        assert all(stage["manifest"] for stage in status["stages"].values())
        # provenance says 'succeeded' just before the driver exits: it is gone moments later
        deadline = time.monotonic() + 120
        again = remote_status(remote, None, record["run_dir"])  # by directory instead of id
        while again["alive"] and time.monotonic() < deadline:
            time.sleep(1)
            again = remote_status(remote, None, record["run_dir"])
        assert again["status"] == "succeeded" and again["alive"] is False
        by_id = remote_status(remote, None, record["run_id"], repo_dir=str(repo))  # the id alone
        assert by_id["status"] == "succeeded" and by_id["run_dir"] == record["run_dir"]
        assert len(remote.payloads) >= 3  # submit, at least one poll, the last status


def _stop_if_running(pid: int) -> None:
    """End the detached run this test started, if it is still there (by its own process group id)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(1)
    os.killpg(pid, signal.SIGTERM)
