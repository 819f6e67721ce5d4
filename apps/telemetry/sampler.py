"""Telemetry of a database's processes: CPU, memory, disk and network once a second, per benchmark phase.

:class:`Sampler` is a background thread that reads, every ``interval`` seconds, each watched process and
its children through psutil (``/proc/<pid>/stat``, ``status`` and ``io``) and keeps one row per process
and tick; :meth:`Sampler.stop` writes them atomically to Parquet (:data:`TELEMETRY_SCHEMA`). The counters
are the kernel's cumulative ones (rates are differences of consecutive rows), except ``cpu_percent``,
which is the process's CPU time over the last interval (100 = one core busy; null on a process's first
row).

Which processes: the servers a local deployment started (``Deployment.server_pids()``) and their
children, role ``server`` / ``child``. An in-process engine (``Endpoints.in_process``: Qdrant edge, and
FAISS / LanceDB) runs inside whatever client process opened it: insert, index and query tasks run in
Parsl workers the driver does not know. Such a process announces itself when it opens the engine
(:func:`announce_engine`, called by ``DatabaseTarget.open_client``: one empty file named
``<host>-<pid>`` in the directory beside the engine's data directory) and the sampler picks it up at the
next tick (role ``engine``). A client process that only talks to a server is not sampled.

The driver side (which phases, which files, merging the pilot ranks' rows) is
:mod:`apps.telemetry.collector`, which imports this module and never the other way round.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa

from core.store import atomic_write_json, write_parquet_atomic

log = logging.getLogger(__name__)

TELEMETRY_SCHEMA = pa.schema(
    [
        pa.field("time", pa.float64(), nullable=False),  # time.time() of the sample
        pa.field("phase", pa.string(), nullable=False),  # one of PHASES
        pa.field("node", pa.string(), nullable=False),  # host name of the sampled process
        pa.field("process", pa.string(), nullable=False),  # server name; "<server>/<exe>" for a child
        pa.field("pid", pa.int64(), nullable=False),
        pa.field("role", pa.string(), nullable=False),  # server | child | engine (in-process engine)
        pa.field("cpu_percent", pa.float64()),  # CPU time / wall time over the last interval x 100
        pa.field("rss_bytes", pa.int64()),
        pa.field("read_bytes", pa.int64()),  # cumulative bytes fetched from storage (/proc/<pid>/io)
        pa.field("write_bytes", pa.int64()),  # cumulative bytes sent to storage
        pa.field("read_calls", pa.int64()),  # cumulative read syscalls (syscr; mmap faults not counted)
        pa.field("write_calls", pa.int64()),  # cumulative write syscalls (syscw)
        pa.field("read_chars", pa.int64()),  # cumulative bytes read by syscalls, page-cache hits too (rchar)
        pa.field("write_chars", pa.int64()),  # cumulative bytes written by syscalls (wchar)
        # Node-wide, all interfaces incl. loopback (psutil.net_io_counters): per-process network
        # counters do not exist without eBPF, so every row of one tick carries the same node totals.
        pa.field("net_sent", pa.int64()),
        pa.field("net_recv", pa.int64()),
        pa.field("threads", pa.int32()),
        # The pilot rank whose sampler took the row (HPC, :mod:`apps.telemetry.collector`); null locally.
        pa.field("rank", pa.int32()),
    ]
)
PHASES = ("deploy", "insert", "index", "query", "mixed", "teardown")  # in the order they come
ENGINE_DIR_SUFFIX = ".engine-pids"
SERVER_PIDS = "server_pids.json"

# name -> (pid, role) of the processes to watch; their children are added by the sampler.
Roots = dict[str, tuple[int, str]]


def engine_registry(data_dir: str | Path) -> Path:
    """The directory where in-process engine processes of ``data_dir`` announce themselves (beside it)."""
    path = Path(data_dir)
    return path.with_name(path.name + ENGINE_DIR_SUFFIX)


def announce_engine(data_dir: str | Path) -> None:
    """Record that this process runs the in-process engine whose data is ``data_dir`` (idempotent).

    Best effort: telemetry must never fail the stage that opens the engine.
    """
    try:
        registry = engine_registry(data_dir)
        registry.mkdir(parents=True, exist_ok=True)
        (registry / f"{socket.gethostname()}-{os.getpid()}").touch()
    except OSError as exc:
        log.warning("telemetry: cannot announce the engine process of %s: %s", data_dir, exc)


def engine_pids(data_dir: str | Path, host: str | None = None) -> list[int]:
    """Pids of the engine processes announced for ``data_dir`` on ``host`` (this host by default)."""
    host = host or socket.gethostname()
    registry = engine_registry(data_dir)
    if not registry.is_dir():
        return []
    pids = []
    for entry in registry.iterdir():
        name, _, pid = entry.name.rpartition("-")
        if name == host and pid.isdigit():
            pids.append(int(pid))
    return sorted(pids)


def write_server_pids(db_dir: Path, pids: dict[str, int]) -> None:
    """``<db_dir>/server_pids.json``: the local server pids and this host (for
    :mod:`apps.vdb.stages.query_io`)."""
    atomic_write_json(db_dir / SERVER_PIDS, {"host": socket.gethostname(), "pids": pids})


class Sampler:
    """Samples the processes ``roots()`` names (and their children) every ``interval`` s in a thread."""

    def __init__(
        self,
        roots: Callable[[], Roots],
        out: Path,
        interval: float = 1.0,
        node: str | None = None,
        rank: int | None = None,
    ) -> None:
        self.roots, self.out, self.interval = roots, out, interval
        self.phase = "start"
        self.node = node or socket.gethostname()
        self.rank = rank
        self.rows: list[dict[str, Any]] = []
        self.errors = 0
        self._procs: dict[int, psutil.Process] = {}
        self._cpu: dict[tuple[int, float], tuple[float, float]] = {}  # (pid, created) -> (cpu s, mono s)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self, phase: str = "deploy") -> Sampler:
        """Start sampling (one sample now, then one every ``interval`` s) in a daemon thread."""
        self.phase = phase
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._thread.start()
        return self

    def set_phase(self, phase: str) -> None:
        """Label the following samples; takes one sample now so a short phase has a row."""
        self.phase = phase
        self.sample()

    def stop(self) -> dict[str, Any] | None:
        """Stop the thread, take a last sample, write the Parquet file; its ``{rows, bytes, sha256}``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        with self._lock:
            table = pa.Table.from_pylist(self.rows, schema=TELEMETRY_SCHEMA)
        return write_parquet_atomic(table, self.out, row_group_rows=65536)

    def __enter__(self) -> Sampler:
        return self.start(self.phase if self.phase != "start" else "deploy")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        due = time.monotonic()
        while True:
            self.sample()
            due += self.interval
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return

    def sample(self) -> None:
        """One row per watched process now (errors are counted and logged once, never raised)."""
        with self._lock:  # the thread and a phase change may sample at once
            try:
                self.rows.extend(self._read())
            except Exception as exc:  # telemetry must not break the benchmark
                self.errors += 1
                if self.errors == 1:
                    log.warning("telemetry: a sample failed: %s", exc, exc_info=True)

    def _watched(self) -> list[tuple[str, psutil.Process, str]]:
        """(process name, process, role) of every root and each root's living children."""
        found = []
        for name, (pid, role) in sorted(self.roots().items()):
            proc = self._process(pid)
            if proc is None:
                continue
            found.append((name, proc, role))
            try:
                children = proc.children(recursive=True)
            except psutil.Error:
                continue
            for child in children:
                cached = self._process(child.pid)
                if cached is not None:
                    found.append((f"{name}/{_exe_name(cached)}", cached, "child"))
        return found

    def _process(self, pid: int) -> psutil.Process | None:
        """The cached Process of ``pid`` (a new one when the pid was reused), or None when gone."""
        proc = self._procs.get(pid)
        try:
            if proc is None or not proc.is_running():
                proc = self._procs[pid] = psutil.Process(pid)
            return proc
        except psutil.Error:
            self._procs.pop(pid, None)
            return None

    def _read(self) -> list[dict[str, Any]]:
        now, mono = time.time(), time.monotonic()
        net = psutil.net_io_counters()
        rows = []
        for name, proc, role in self._watched():
            values = read_process(proc)
            if values is None:
                continue
            key = (proc.pid, values.pop("created"))
            cpu_s = values.pop("cpu_s")
            last = self._cpu.get(key)
            cpu = None
            if last is None or mono - last[1] >= self.interval / 2:
                # A sample right after another (a phase change) keeps the older base: CPU time is
                # counted in clock ticks, too coarse for a few milliseconds.
                self._cpu[key] = (cpu_s, mono)
            if last is not None and mono - last[1] >= self.interval / 2:
                cpu = 100.0 * (cpu_s - last[0]) / (mono - last[1])
            rows.append(
                {
                    "time": now,
                    "phase": self.phase,
                    "node": self.node,
                    "process": name,
                    "pid": proc.pid,
                    "role": role,
                    "cpu_percent": cpu,
                    "net_sent": net.bytes_sent if net else None,
                    "net_recv": net.bytes_recv if net else None,
                    "rank": self.rank,
                    **values,
                }
            )
        return rows


def _exe_name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return str(proc.pid)


def read_process(proc: psutil.Process) -> dict[str, Any] | None:
    """CPU seconds, RSS, I/O counters and threads of ``proc`` now; None when it has exited or is exiting.

    I/O counters are None where the kernel does not let this user read them. A process whose memory the
    kernel has already released (RSS 0: on its way out at teardown, not yet a zombie) is no sample either.
    """
    try:
        with proc.oneshot():
            times = proc.cpu_times()
            values: dict[str, Any] = {
                "created": proc.create_time(),
                "cpu_s": times.user + times.system,
                "rss_bytes": proc.memory_info().rss,
                "threads": proc.num_threads(),
            }
            try:
                io = proc.io_counters()
            except (psutil.AccessDenied, AttributeError):
                io = None
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    if not values["rss_bytes"]:
        return None
    values.update(
        read_bytes=io and io.read_bytes,
        write_bytes=io and io.write_bytes,
        read_calls=io and io.read_count,
        write_calls=io and io.write_count,
        read_chars=getattr(io, "read_chars", None),
        write_chars=getattr(io, "write_chars", None),
    )
    return values


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (an exited process not yet reaped by its parent, a zombie, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def main(argv: list[str] | None = None) -> int:
    """``python -m apps.telemetry``: sample given pids until they exit, SIGTERM, or the ``--while-alive``
    process exits; write Parquet."""
    parser = argparse.ArgumentParser(prog="python -m apps.telemetry", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--pids", help="comma-separated pids to sample (with their children)")
    group.add_argument("--pid-file", type=Path, help="file holding one pid (e.g. a server's pid file)")
    parser.add_argument("--out", type=Path, required=True, help="Parquet file to write at the end")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--phase", default="run", help="phase label of every row")
    parser.add_argument("--node", help="node label of every row (default: this host's name)")
    parser.add_argument("--rank", type=int, help="pilot rank of the server: rows named rank-NNN")
    parser.add_argument(
        "--while-alive", type=int, help="also stop when this process (the rank's shell) has exited"
    )
    args = parser.parse_args(argv)
    text = args.pids if args.pids else args.pid_file.read_text()
    pids = [int(p) for p in text.replace(",", " ").split()]
    prefix = f"rank-{args.rank:03d}" if args.rank is not None else None
    roots = {
        (f"pid-{pid}" if prefix is None else prefix if len(pids) == 1 else f"{prefix}-{pid}"): (pid, "server")
        for pid in pids
    }
    sampler = Sampler(lambda: roots, args.out, args.interval, node=args.node, rank=args.rank)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    sampler.start(args.phase)
    try:
        while not stopped.wait(args.interval) and any(_alive(p) for p in pids):
            if args.while_alive is not None and not _alive(args.while_alive):
                break
    except KeyboardInterrupt:
        pass
    sampler.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
