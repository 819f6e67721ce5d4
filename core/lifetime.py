"""What a run started and who holds a workdir: watchdogs, process records, leftovers, the workdir lock.

Under ``<workdir>/.run/``: ``lock`` (an ``fcntl`` lock held for the whole run; its text names the holder)
and ``processes/`` (one JSON record per process group the run started: the driver itself, the worker
pool, each database server; with pid, start time, process group, host). Every process a run starts
inherits ``PES2O_RUN_ID`` from the driver, so a leftover is recognised by its environment or by its
recorded pid *and* start time — a recycled pid is never taken for one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from core import watchdog
from core.errors import PipelineError
from core.watchdog import REGISTRY_VAR, RUN_VAR, create_time, is_alive, terminate

STATE_DIR = ".run"
WATCHDOG = Path(watchdog.__file__).resolve()


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill PID``, a job's cancellation) raised in the main thread: the process stops as on
    Ctrl-C, through every ``finally`` (the Parsl executor and its interchange, the database servers)."""


def stop_on_sigterm() -> None:
    """Make SIGTERM end this process like Ctrl-C (:class:`Terminated`) instead of at once, and ignore a
    repeat while it stops (SIGKILL still ends it; the watchdogs then stop what it started).

    Without this the driver dies where it stands, and Parsl's interchange, a child with no watchdog of its
    own, outlives it. Call from the main thread (``signal.signal`` works only there).
    """

    def raise_terminated(signum: int, frame: Any) -> None:
        # A handler, not SIG_IGN: a process started during the cleanup must not inherit SIGTERM ignored.
        signal.signal(signal.SIGTERM, lambda *_: None)
        raise Terminated()

    signal.signal(signal.SIGTERM, raise_terminated)


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Hold SIGINT pending in this thread while the block starts processes, then deliver it here.

    A terminal's Ctrl-C goes to its whole foreground process group. Processes started inside the block
    inherit the mask and never see it: Parsl's interchange (started by ``parsl.load``) otherwise dies of
    the Ctrl-C meant for the driver, prints its traceback on the user's terminal, and Parsl's cleanup then
    waits on it; the driver stops what it started itself, as on SIGTERM. A Ctrl-C pressed inside the block
    is not lost: it is raised here as the block ends.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class WorkdirBusyError(PipelineError):
    """Another live run holds the workdir (exit code 75, EX_TEMPFAIL: try again when it has finished)."""

    exit_code = 75


# --- watchdogs ---------------------------------------------------------------------------------------


def watchdog_command(*target: str, grace: float = 3.0, name: str = "worker pool") -> list[str]:
    """argv of a watchdog that stops ``target`` (``--pgid N`` or ``--own-group``) when this process dies."""
    pid, started = os.getpid(), create_time(os.getpid())
    watched = f"{pid}:{started!r}" if started is not None else str(pid)
    return [sys.executable, str(WATCHDOG), "--watch", watched, *target, "--grace", str(grace), "--name", name]


def pool_watchdog_shell(log: Path) -> str:
    """One shell command for a worker pool's ``worker_init``: a watchdog on the pool's own process group.

    In a subshell, backgrounded, so it fits a ``; ``-joined line; it leaves the group itself (setsid).
    """
    argv = shlex.join(watchdog_command("--own-group"))
    return f"({argv} </dev/null >>{shlex.quote(str(log))} 2>&1 &)"


def start_watchdog(pgid: int, name: str, log: IO[bytes] | int, grace: float = 5.0) -> subprocess.Popen[bytes]:
    """A watchdog in its own session that stops process group ``pgid`` when this process dies."""
    return subprocess.Popen(
        watchdog_command("--pgid", str(pgid), grace=grace, name=name),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a kill of this process's group must not take the watchdog with it
    )


# --- process records -----------------------------------------------------------------------------------


def record_group(name: str, pid: int, pgid: int | None, watchdog_pid: int | None = None) -> Path | None:
    """Record a process group this run started (None outside a run: no registry in the environment)."""
    registry, run = os.environ.get(REGISTRY_VAR), os.environ.get(RUN_VAR)
    if not (registry and run):
        return None
    record: dict[str, Any] = {
        "run": run,
        "name": name,
        "pid": pid,
        "started": create_time(pid),
        "pgid": pgid,
        "host": socket.gethostname(),
        "watchdog": [watchdog_pid, create_time(watchdog_pid)] if watchdog_pid else None,
    }
    return watchdog.write_record(Path(registry), record)


def record_job(name: str, job_id: str, cancel: list[str]) -> Path | None:
    """Record a batch job this run submitted and the command that cancels it (``cancel`` + the id).

    A driver killed outright cannot cancel its jobs; the next run in the workdir does (see
    :func:`stop_leftovers`), so no worker block or database pilot holds its nodes until walltime.
    """
    registry, run = os.environ.get(REGISTRY_VAR), os.environ.get(RUN_VAR)
    if not (registry and run):
        return None
    safe_id = "".join(c if c.isalnum() else "_" for c in job_id)
    record = {"run": run, "name": name, "pid": f"job-{safe_id}", "job": job_id, "cancel": [*cancel, job_id]}
    return watchdog.write_record(Path(registry), record | {"host": socket.gethostname()})


def _cancel_jobs(records: list[dict[str, Any]]) -> list[str]:
    """Cancel the batch jobs of a dead run; one line per job (a job already gone is not an error)."""
    lines = []
    for rec in records:
        if not rec.get("cancel"):
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(rec["cancel"], capture_output=True, timeout=30, check=False)
            lines.append(f"{rec['run']}: batch job {rec['job']} ({rec['name']}) cancelled")
    return lines


def forget(record: Path | None) -> None:
    """Remove a process record (its processes have stopped)."""
    if record is not None:
        with contextlib.suppress(FileNotFoundError):
            record.unlink()


def read_records(registry: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every readable record in ``registry`` with its path (unreadable ones are skipped)."""
    found = []
    for path in sorted(registry.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            found.append((path, json.loads(path.read_text())))
    return found


def _run_processes(runs: set[str], groups: set[int], exact: set[tuple[int, float]]) -> list[psutil.Process]:
    """Live processes that carry one of ``runs`` in their environment (those in ``groups`` only, when
    given), or are one of the ``exact`` (pid, start time) pairs; never this process."""
    me, found = os.getpid(), []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            recorded = any(pid == proc.pid and is_alive(pid, started) for pid, started in exact)
            in_run = proc.environ().get(RUN_VAR) in runs and (not groups or os.getpgid(proc.pid) in groups)
            if recorded or in_run:
                found.append(proc)
    return found


def _exact(records: list[dict[str, Any]]) -> set[tuple[int, float]]:
    pairs = set()
    for rec in records:
        if rec.get("started") is not None and rec.get("name") != "driver" and not rec.get("job"):
            pairs.add((rec["pid"], rec["started"]))
        if rec.get("watchdog") and rec["watchdog"][1] is not None:
            pairs.add((rec["watchdog"][0], rec["watchdog"][1]))
    return pairs


def stop_leftovers(workdir: Path, grace: float = 5.0) -> list[str]:
    """Stop what earlier runs in ``workdir`` left running (on this host) and delete their records.

    A run whose driver is still alive is left alone. Returns one line per process stopped.
    """
    registry, host = Path(workdir) / STATE_DIR / "processes", socket.gethostname()
    by_run: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for path, rec in read_records(registry):
        if rec.get("host") == host:
            by_run.setdefault(rec.get("run", ""), []).append((path, rec))
    stopped: list[str] = []
    for run, entries in by_run.items():
        records = [rec for _, rec in entries]
        if any(r.get("name") == "driver" and is_alive(r["pid"], r.get("started")) for r in records):
            continue
        stopped += _cancel_jobs(records)
        procs = _run_processes({run}, set(), _exact(records))
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                command = " ".join(" ".join(proc.cmdline()).split())  # a process title's padding dropped
                stopped.append(f"{run}: pid {proc.pid} {command[:120]}")
        if procs:
            terminate(lambda run=run, records=records: _run_processes({run}, set(), _exact(records)), grace)
        for path, _ in entries:
            forget(path)
    return stopped


def stop_run_groups(workdir: Path, run: str, grace: float = 5.0) -> None:
    """At the end of a run: stop the groups it recorded that still run (its driver excepted)."""
    registry = Path(workdir) / STATE_DIR / "processes"
    entries = [(p, r) for p, r in read_records(registry) if r.get("run") == run and r.get("name") != "driver"]
    records = [r for _, r in entries]
    _cancel_jobs(records)  # batch jobs whose cancel the run's own teardown did not reach
    groups = {r["pgid"] for r in records if r.get("pgid")}

    def members() -> list[psutil.Process]:
        return _run_processes({run}, groups, _exact(records)) if groups or records else []

    if members():
        terminate(members, grace)
    for path, _ in entries:
        forget(path)


# --- the workdir lock ----------------------------------------------------------------------------------


@dataclass
class WorkdirLock:
    """An exclusive ``fcntl`` lock on ``<workdir>/.run/lock``, held until :meth:`release` or process death."""

    path: Path
    fh: IO[str]
    taken: float = field(default_factory=time.time)  # when this run took it (a process may run several)

    @classmethod
    def acquire(cls, workdir: Path) -> WorkdirLock:
        """Take the lock or raise WorkdirBusyError naming the run that holds it."""
        path = Path(workdir) / STATE_DIR / "lock"
        # An OSError here (a workdir under a file, a read-only disk) is the caller's to name: it knows the
        # config line the workdir came from.
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held open for the whole run
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip()
            fh.close()
            raise WorkdirBusyError(
                f"workdir {workdir} is in use by another run ({holder or 'holder unknown'}); "
                "wait for it to finish, or give this run another workdir"
            ) from None
        lock = cls(path, fh)
        lock.note(None)
        return lock

    def note(self, run: str | None) -> None:
        """Say in the lock file who holds it: pid, host, when it took the lock and (once known) the run id."""
        pid = os.getpid()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.taken))
        text = f"run {run or '(starting)'}, pid {pid} on {socket.gethostname()}, started {stamp}"
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(text + "\n")
        self.fh.flush()

    def release(self) -> None:
        """Give the lock up (closing the file releases it)."""
        with contextlib.suppress(OSError):
            fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()
