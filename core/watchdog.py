"""Stop a process group when the driver it serves dies; clean its POSIX semaphores from ``/dev/shm``.

A run's worker pool and database servers each sit in their own process group (or session), so a
``kill -9`` of the driver's group does not reach them. One watchdog per group polls the driver (pid and
start time, so a recycled pid never counts as alive) and, once it is gone, sends SIGTERM to the group,
SIGKILL after a grace period, and unlinks the ``/dev/shm/sem.*`` files the group's processes had mapped
(multiprocessing's named semaphores, which leak when its resource tracker dies by SIGKILL).

The watchdog runs as a script given by path (``python .../core/watchdog.py``): it imports only psutil and
the standard library, so a worker pool's shell can start it without this project on ``sys.path``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

POLL = 0.5  # seconds between checks of the driver: the group dies within POLL + grace
RUN_VAR = "PES2O_RUN_ID"  # set by the driver for the whole run; every process it starts inherits it
REGISTRY_VAR = "PES2O_RUN_REGISTRY"  # directory of process records (one JSON file per group)
SHM = Path("/dev/shm")


def create_time(pid: int) -> float | None:
    """When ``pid`` started, in clock ticks since boot (None when there is no such process).

    Boot-relative ticks (field 22 of /proc/<pid>/stat) identify a process across pid reuse and, unlike a
    wall-clock start time (psutil recomputes that from the boot time on every call), do not move when the
    clock is stepped (NTP, a resumed VM): a stepped clock must never make a live driver look dead.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return float(stat[stat.rindex(")") + 2 :].split()[19])  # fields after "(comm)": 3.. -> 22 is [19]
    except (OSError, ValueError, IndexError):
        pass
    try:  # no /proc: psutil's start time, the best identity this platform offers
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def is_alive(pid: int, started: float | None) -> bool:
    """True while ``pid`` runs and is the process that started at ``started`` (a zombie counts as dead)."""
    try:
        proc = psutil.Process(pid)
        if started is not None and create_time(pid) != started:
            return False  # the pid was recycled
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def group_alive(pgid: int) -> bool:
    """True while any process is in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> list[psutil.Process]:
    """The live processes of group ``pgid``."""
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
    return members


def mapped_semaphores(pids: Iterable[int]) -> set[Path]:
    """The ``/dev/shm/sem.*`` files mapped by ``pids`` (from /proc/<pid>/maps; empty off Linux).

    Matched by inode: glibc builds a semaphore under a temporary name and links it to its real one, so
    the process that created it maps a "(deleted)" name; the inode is the file's either way.
    """
    inodes: set[int] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
                lines = fh.readlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(f"{SHM}/sem."):
                inodes.add(int(fields[4]))
    if not inodes:
        return set()
    found = set()
    for sem in SHM.glob("sem.*"):
        with contextlib.suppress(OSError):
            if sem.stat().st_ino in inodes:
                found.add(sem)
    return found


def unlink_unused(semaphores: Iterable[Path]) -> list[Path]:
    """Unlink the given semaphores that no live process maps any more; return those removed."""
    semaphores = [s for s in semaphores if s.exists()]
    if not semaphores:
        return []
    in_use = mapped_semaphores(p.pid for p in psutil.process_iter())
    removed = []
    for sem in semaphores:
        if sem not in in_use:
            with contextlib.suppress(FileNotFoundError):
                sem.unlink()
                removed.append(sem)
    return removed


def terminate(
    members: Callable[[], list[psutil.Process]], grace: float, signal_all: Callable[[int], None] | None = None
) -> set[Path]:
    """SIGTERM ``members()``, SIGKILL whatever is left after ``grace`` s; unlink their semaphores.

    ``members`` is called again on every round so processes forked meanwhile are caught too;
    ``signal_all`` (a killpg) reaches the whole group at once where the caller owns it.
    """
    semaphores: set[Path] = set()
    deadline = time.monotonic() + grace
    sig = signal.SIGTERM
    while True:
        procs = members()
        if not procs:
            break
        semaphores |= mapped_semaphores(p.pid for p in procs)
        if signal_all is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal_all(sig)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        if sig == signal.SIGTERM and time.monotonic() >= deadline:
            sig = signal.SIGKILL
        time.sleep(0.1 if sig == signal.SIGKILL else 0.2)
        if sig == signal.SIGKILL and time.monotonic() > deadline + 10:
            break  # unkillable (D state): give up rather than hang
    # Let a resource tracker that survived the SIGTERM unlink first; remove what it left.
    unlink_unused(semaphores)
    return semaphores


def write_record(registry: Path, record: dict) -> Path:
    """Write one process record atomically as ``<registry>/<run>.<pid>.json``; return its path."""
    registry.mkdir(parents=True, exist_ok=True)
    path = registry / f"{record['run']}.{record['pid']}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)
    return path


def watch(driver: int, driver_started: float | None, pgid: int, grace: float, record: Path | None) -> int:
    """Poll until the driver or the group is gone; stop the group if the driver went first."""
    while group_alive(pgid):
        if not is_alive(driver, driver_started):
            print(f"watchdog: driver {driver} is gone; stopping process group {pgid}", flush=True)
            terminate(lambda: group_members(pgid), grace, lambda sig: os.killpg(pgid, sig))
            break
        time.sleep(POLL)
    if record is not None:
        with contextlib.suppress(FileNotFoundError):
            record.unlink()  # the group is gone: nothing is left for the next run to stop
    return 0


def main(argv: list[str] | None = None) -> int:
    """``watchdog.py --watch PID:START (--pgid N | --own-group) [--grace S] [--name NAME]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watch", required=True, help="driver PID:START_TIME")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--pgid", type=int, help="the process group to stop")
    target.add_argument("--own-group", action="store_true", help="the group this watchdog was started in")
    parser.add_argument("--grace", type=float, default=3.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--name", default="worker pool", help="what the group is (recorded)")
    args = parser.parse_args(argv)
    pid_text, _, started_text = args.watch.partition(":")
    driver, driver_started = int(pid_text), (float(started_text) if started_text else None)
    pgid = args.pgid
    if args.own_group:
        pgid = os.getpgrp()
        os.setsid()  # leave the group: stopping it (or Parsl cancelling it) must not stop the watchdog
    record = None
    registry, run = os.environ.get(REGISTRY_VAR), os.environ.get(RUN_VAR)
    if args.own_group and registry and run:
        me = os.getpid()
        record = write_record(
            Path(registry),
            {"run": run, "name": args.name, "pid": me, "started": create_time(me), "pgid": pgid,
             "host": socket.gethostname(), "watchdog": [me, create_time(me)]},
        )  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stopped by its owner: leave quietly
    return watch(driver, driver_started, pgid, args.grace, record)


if __name__ == "__main__":
    sys.exit(main())
