"""Nothing a run starts outlives it; a second run in the same workdir is refused while the first is live.

The fast tests drive the watchdog, the process records and the workdir lock directly with ``sleep``
processes; the slow ones ``kill -9`` a real ``python -m pipeline run`` (its whole process group) during
embedding and during the database stage, and run two runs in one workdir at once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml

from core.lifetime import STATE_DIR, WATCHDOG, WorkdirBusyError, WorkdirLock, stop_leftovers
from core.watchdog import RUN_VAR, create_time, mapped_semaphores, write_record
from tests.conftest import REPO, base_config, interruptible, run_cli, sample_records, write_jsonl

MARK = "PES2O_LIFETIME_TEST"  # set on the runs these tests start; every process of theirs inherits it
BOUND = 20.0  # seconds within which a killed run's processes must be gone (watchdog poll + grace + slack)


def marked(token: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``MARK=token``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARK) == token:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def wait_until(condition: Callable[[], object], timeout: float, poll: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return bool(condition())


def living(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` still running (a zombie, or one gone between the two reads, is not)."""
    found = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def kill_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            continue


def describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for proc in procs:
        try:
            out.append(f"{proc.pid} {' '.join(proc.cmdline())[:150]}")
        except psutil.Error:
            continue
    return out


# --- fast: the pieces ------------------------------------------------------------------------------------


SEMAPHORE_HOLDER = """
import multiprocessing, subprocess, sys, time
lock = multiprocessing.get_context("spawn").Lock()  # a named POSIX semaphore in /dev/shm
child = subprocess.Popen(["sleep", "600"])  # a helper in the same group
print(lock._semlock.name, flush=True)
time.sleep(600)
"""


def test_watchdog_stops_the_group_and_unlinks_its_semaphores_when_the_driver_dies() -> None:
    driver = subprocess.Popen(["sleep", "600"])
    group = subprocess.Popen(
        [sys.executable, "-c", SEMAPHORE_HOLDER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    watchdog = None
    try:
        name = group.stdout.readline().strip()
        semaphore = Path("/dev/shm") / f"sem.{name.lstrip('/')}"
        assert semaphore.exists()
        watchdog = subprocess.Popen(
            [sys.executable, str(WATCHDOG), "--watch", f"{driver.pid}:{create_time(driver.pid)!r}",
             "--pgid", str(group.pid), "--grace", "1"]
        )  # fmt: skip
        time.sleep(1.0)
        assert group.poll() is None, "the watchdog must leave the group alone while the driver lives"
        driver.kill()
        driver.wait()
        assert wait_until(lambda: not psutil.pid_exists(group.pid) or group.poll() is not None, 10)
        assert wait_until(lambda: not any(p.pid for p in _group(group.pid)), 10), (
            "a helper of the group survived"
        )
        assert wait_until(lambda: not semaphore.exists(), 5), f"{semaphore} leaked"
        assert watchdog.wait(timeout=10) == 0
    finally:
        for proc in (driver, watchdog):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if group.poll() is None:
            os.killpg(group.pid, signal.SIGKILL)
            group.wait()


def _group(pgid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def test_next_run_stops_what_a_dead_run_left_but_never_a_recycled_pid(tmp_path: Path) -> None:
    """A record names a dead driver and two groups: one still running (the run's id in its environment),
    one whose pid now belongs to an unrelated process (other start time, no run id): only the first dies."""
    run = f"test-{uuid.uuid4().hex[:8]}"
    registry = tmp_path / STATE_DIR / "processes"
    gone = subprocess.Popen(["true"])
    gone_started = create_time(gone.pid) or time.time()
    gone.wait()
    leftover = subprocess.Popen(["sleep", "600"], env={**os.environ, RUN_VAR: run}, start_new_session=True)
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        host = socket.gethostname()
        common = {"run": run, "host": host, "watchdog": None}
        write_record(
            registry, {**common, "name": "driver", "pid": gone.pid, "started": gone_started, "pgid": None}
        )
        live = {"pid": leftover.pid, "started": create_time(leftover.pid), "pgid": leftover.pid}
        write_record(registry, {**common, "name": "weaviate node0", **live})
        # a live pid, but one that started at another time: the recorded process is gone, the pid recycled
        then = (create_time(stranger.pid) or 0) - 1000
        recycled = {"pid": stranger.pid, "started": then, "pgid": stranger.pid}
        write_record(registry, {**common, "name": "milvus", **recycled})
        stopped = stop_leftovers(tmp_path, grace=1)
        assert len(stopped) == 1 and stopped[0].endswith(f"pid {leftover.pid} sleep 600")
        assert leftover.wait(timeout=10) is not None
        assert stranger.poll() is None, "a recycled pid was killed"
        assert list(registry.glob("*.json")) == []
    finally:
        for proc in (leftover, stranger):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_live_run_is_not_a_leftover(tmp_path: Path) -> None:
    run = f"test-{uuid.uuid4().hex[:8]}"
    child = subprocess.Popen(["sleep", "600"], env={**os.environ, RUN_VAR: run})
    try:
        me = os.getpid()
        write_record(tmp_path / STATE_DIR / "processes", {"run": run, "name": "driver", "pid": me,
                     "started": create_time(me), "pgid": None, "host": socket.gethostname(),
                     "watchdog": None})  # fmt: skip
        assert stop_leftovers(tmp_path, grace=1) == []
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_second_lock_on_a_workdir_names_the_holder(tmp_path: Path) -> None:
    first = WorkdirLock.acquire(tmp_path)
    try:
        first.taken = 86400.0  # a day after the epoch: not when this process started
        first.note("test-20260101T000000Z-abcdef12")
        with pytest.raises(WorkdirBusyError) as err:
            WorkdirLock.acquire(tmp_path)
        message = str(err.value)
        assert "test-20260101T000000Z-abcdef12" in message and f"pid {os.getpid()}" in message
        # when the run took the workdir, not when its process started (--dataset all runs several)
        assert f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(86400.0))}" in message
        assert err.value.exit_code != 0
    finally:
        first.release()
    WorkdirLock.acquire(tmp_path).release()  # free again once released


# --- slow: real runs killed with kill -9 -------------------------------------------------------------------

WEAVIATE_VDB = {
    "databases": [{"name": "weaviate"}],
    "collection": {"index_type": "hnsw", "hnsw_m": 16, "ef_construction": 64},
    "insert": {"batch_sizes": [32], "clients_per_worker": 1},
    "query": {
        "ef": [16, 32, 64, 128, 256],
        "batch_size": [1],
        "clients": [1],
        "k": [10],
        "warmup_queries": 4,
        "duration_s": None,
    },
}


def write_run_config(root: Path, **sections) -> Path:
    corpus = write_jsonl(root / "corpus.jsonl", sample_records(60))
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(base_config(corpus, root / "wd", **sections)))
    return config


def start_run(config: Path, token: str, stderr=subprocess.DEVNULL, preexec_fn=None) -> subprocess.Popen:
    """``python -m pipeline run`` in its own process group, marked with ``token``."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", str(config)],
        cwd=REPO,
        env={**os.environ, MARK: token, "COLUMNS": "200"},
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
        start_new_session=True,
        preexec_fn=preexec_fn,
    )


def run_marked(config: Path, token: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m pipeline run`` to its end, marked with ``token``."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(config)],
        cwd=REPO,
        env={**os.environ, MARK: token, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def kill_run(proc: subprocess.Popen) -> None:
    """kill -9 the run's whole process group (what a scheduler or a user's ``kill -9 -PGID`` does)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def assert_nothing_survives(token: str, semaphores: set[Path]) -> None:
    try:
        assert wait_until(lambda: not marked(token), BOUND), (
            f"still alive {BOUND:.0f}s after the kill: {describe(marked(token))}"
        )
        leaked = [s for s in semaphores if s.exists()]
        assert leaked == [], f"semaphores left in /dev/shm: {leaked}"
    finally:
        kill_all(marked(token))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stage", "sections", "started", "expected"),
    [
        ("embedding", {}, lambda wd: len(list(wd.rglob("_shards/*.json"))) >= 2, "process_worker_pool"),
        ("database", {"vdb": WEAVIATE_VDB}, lambda wd: list(wd.rglob("endpoints.json")), "weaviate-server"),
    ],
)
def test_kill_of_the_run_stops_what_it_started(tmp_path: Path, stage, sections, started, expected) -> None:
    """kill -9 of the run's process group during ``stage``: its pool, workers and servers die within BOUND s
    and leave no semaphore behind."""
    config, token = write_run_config(tmp_path, **sections), uuid.uuid4().hex
    proc = start_run(config, token)
    try:
        assert wait_until(lambda: started(tmp_path / "wd"), 600, 0.05)
        names = " ".join(describe(marked(token)))
        assert expected in names, f"{expected} should be running during {stage}"
        semaphores = mapped_semaphores(p.pid for p in marked(token))
    finally:
        kill_run(proc)
    assert_nothing_survives(token, semaphores)


# (signal, sent to the driver alone or its whole process group, exit code, the console's line)
STOPS = {
    "kill-pid": (signal.SIGTERM, "driver", 143, "terminated (SIGTERM)"),  # kill PID
    "kill-group": (signal.SIGTERM, "group", 143, "terminated (SIGTERM)"),  # kill -- -PGID, scancel
    "ctrl-c": (signal.SIGINT, "group", 130, "interrupted"),  # a terminal's Ctrl-C: its foreground group
}


@pytest.mark.slow
@pytest.mark.parametrize("stop", sorted(STOPS))
def test_a_stop_signal_stops_the_run_and_everything_it_started(tmp_path: Path, stop: str) -> None:
    """SIGTERM to the driver alone or to its process group, or a terminal's Ctrl-C (SIGINT to the group),
    during embedding: the run stops through its cleanup (exit 143 or 130, one line, provenance
    'interrupted', no traceback) and nothing it started outlives it, Parsl's interchange included.
    Before, SIGTERM to the driver killed it where it stood and the interchange ran on (no watchdog guards
    it); a signal to the group killed the interchange too (Ctrl-C with a traceback on the terminal), and
    Parsl's cleanup then waited for ever on it."""
    signum, to, code, line = STOPS[stop]
    config, token = write_run_config(tmp_path), uuid.uuid4().hex
    with (tmp_path / "stderr.txt").open("w") as stderr:
        proc = start_run(config, token, stderr=stderr, preexec_fn=interruptible)
        try:
            assert wait_until(lambda: len(list((tmp_path / "wd").rglob("_shards/*.json"))) >= 1, 300, 0.05)
            # The interchange retitles itself, which overwrites its environment: found as a child instead.
            started = psutil.Process(proc.pid).children(recursive=True)
            names = " ".join(describe(started))
            assert "interchange" in names, f"precondition: Parsl's interchange should be running: {names}"
            if to == "group":
                os.killpg(proc.pid, signum)  # its own session: the group is the run's alone
            else:
                os.kill(proc.pid, signum)
            proc.wait(timeout=120)
        finally:
            kill_run(proc)
    try:
        assert wait_until(lambda: not living(started), BOUND), (
            f"still alive after the run ended: {describe(living(started))}"
        )
    finally:
        kill_all(living(started))
    assert_nothing_survives(token, set())
    err = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == code, err[-3000:]
    assert line in err and "Traceback" not in err, err[-3000:]
    (provenance,) = (tmp_path / "wd" / "runs").glob("*/provenance.json")
    record = json.loads(provenance.read_text())
    assert record["status"] == "interrupted"
    assert record["error"] == ("terminated (SIGTERM)" if code == 143 else "interrupted (Ctrl-C)")
    status = run_cli("status", str(provenance.parent))  # a script sees it did not finish
    assert status.returncode == 1 and "status interrupted" in status.stdout, status.stdout
    assert "stopped" in status.stdout and "running" not in status.stdout, status.stdout


@pytest.mark.slow
def test_next_run_stops_the_leftovers_of_a_killed_run(tmp_path: Path) -> None:
    """With its watchdogs killed first, a killed run's pool survives; the next run in the workdir stops it."""
    config, token = write_run_config(tmp_path), uuid.uuid4().hex
    proc = start_run(config, token)
    try:
        assert wait_until(lambda: len(list((tmp_path / "wd").rglob("_shards/*.json"))) >= 1, 300, 0.05)
        kill_all([p for p in marked(token) if "watchdog.py" in " ".join(p.cmdline())])
    finally:
        kill_run(proc)
    try:
        time.sleep(2)
        survivors = [p for p in marked(token) if "process_worker_pool" in " ".join(p.cmdline())]
        assert survivors, "precondition: without its watchdog the pool outlives the driver"
        second = uuid.uuid4().hex
        result = run_marked(config, second, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stderr.count("leftover(s) of an earlier run") == 1
        assert "stopped leftovers of earlier runs" not in result.stderr  # said once, not logged again
        assert not living(survivors)
        assert wait_until(lambda: not marked(token) and not marked(second), BOUND)
    finally:
        kill_all(marked(token))


@pytest.mark.slow
def test_second_concurrent_run_is_refused_and_the_first_finishes_intact(tmp_path: Path) -> None:
    config, token = write_run_config(tmp_path), uuid.uuid4().hex
    lock = tmp_path / "wd" / STATE_DIR / "lock"
    first = start_run(config, token, stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: lock.exists() and "run test-" in lock.read_text(), 120)
        result = run_marked(config, token, timeout=300)
        assert result.returncode == 75, result.stderr[-3000:]
        message = " ".join(result.stderr.split())  # the console wraps long lines
        assert f"pid {first.pid}" in message and "in use by another run" in message and "run test-" in message
        assert "Traceback" not in result.stderr
        _, err = first.communicate(timeout=900)
        assert first.returncode == 0, err[-3000:]
    finally:
        kill_run(first)
    runs = sorted((tmp_path / "wd" / "runs").iterdir())
    assert len(runs) == 1, "the refused run must not create a run directory"
    prov = json.loads((runs[0] / "provenance.json").read_text())
    assert prov["status"] == "succeeded"
    for directory in prov["outputs"].values():
        assert (Path(directory) / "manifest.json").exists()
    assert wait_until(lambda: not marked(token), BOUND), describe(marked(token))
