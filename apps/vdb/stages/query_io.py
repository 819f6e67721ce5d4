"""Storage I/O per query (as in ../shared/papers/004): exact counter deltas around each query setting.

Once-a-second telemetry is too coarse for a setting that lasts less than a second, so the query stage
reads the database processes' kernel counters (``/proc/<pid>/io`` through psutil) at the start and the
end of each setting's measured window (after the warm-up, around the released clients) and keeps the
difference in the raw file's metadata (key ``io``). The report divides it by the queries answered:

* ``bytes_read_per_query``: ``read_bytes`` (bytes the processes caused to be fetched from storage, mmap
  faults included; page-cache hits are not) ÷ queries;
* ``read_calls_per_query``: read system calls (``syscr``; an mmap-based engine reads without any) ÷
  queries;
* ``peak_rss_bytes``: the processes' resident-set high-water mark during the window (``VmHWM`` after
  resetting it through ``/proc/<pid>/clear_refs`` at the start; summed over processes, so an upper bound
  of their simultaneous peak; the larger of the RSS at start and end where the reset is refused);
  ``qps_per_gb`` = QPS ÷ that peak in GB (10⁹ bytes);
* ``page_cache``: ``cold`` when the page cache was dropped (``sync``; ``1`` into
  ``/proc/sys/vm/drop_caches``, which needs root) before the setting, as the study does before each run;
  ``warm`` when it was kept (``vdb.query.page_cache: keep``) or dropping was refused (the metadata says
  why).
* ``other_cpu_cores``: the cores that processes other than the database's and the clients' kept busy on
  this host during the window, on average (the host's busy CPU time from ``/proc/stat`` less theirs, over
  the window); null where the database's processes are not known on this host (servers on other nodes,
  attached, or started by a batch job on this same machine: they could not be told from a neighbour).
  A figure measured beside a busy neighbour is not the database's: on two cores one busy process cut
  FAISS's QPS at batch 8 from 44,000 to 1,700 (its OpenMP threads spin-wait for a core).
  The report and the headline name the settings measured so (:data:`BUSY_CORES`).

Which processes: an in-process engine is this very process (the query task); servers are the pids the
runner wrote to ``<db dir>/server_pids.json`` (:func:`apps.telemetry.sampler.write_server_pids`) with their
children, when they run on this host. On HPC the servers run on other nodes: no counters (nulls).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict

from apps.telemetry.sampler import SERVER_PIDS

log = logging.getLogger(__name__)
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
IO_KEY = "io"  # the raw file's metadata key
GB = 1e9
BUSY_CORES = 0.5  # other processes' load above which a setting's figures are said to be disturbed


class IoWindow(BaseModel):
    """The database processes' counter deltas over one setting's measured window."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    page_cache: str  # cold | warm
    page_cache_note: str = ""  # why it is warm (kept, refused, servers on other nodes)
    processes: int  # database processes read (0: none on this host)
    window_s: float | None = None
    read_bytes: int | None = None
    read_calls: int | None = None
    read_chars: int | None = None
    peak_rss_bytes: int | None = None
    host_cpus: int | None = None  # logical CPUs of this host
    others_cpu_s: float | None = None  # CPU time of the host's other processes during the window


def drop_page_cache() -> str:
    """Write dirty pages and drop the clean page cache; '' when done, else why it was not."""
    try:
        os.sync()
        DROP_CACHES.write_text("1")
    except OSError as exc:
        return f"dropping the page cache was refused ({exc.strerror or exc})"
    return ""


def _hwm(proc: psutil.Process) -> int | None:
    """VmHWM (peak resident set) of ``proc`` in bytes, None when unreadable."""
    try:
        match = re.search(r"^VmHWM:\s+(\d+) kB", Path(f"/proc/{proc.pid}/status").read_text(), re.M)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def _reset_hwm(proc: psutil.Process) -> bool:
    """Reset the peak-RSS mark of ``proc`` (``5`` into clear_refs, Linux ≥ 4.0); False when refused."""
    try:
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class QueryIo:
    """The query stage's probe: ``prepare()`` before each setting, ``window()`` around its measurement."""

    def __init__(self, in_process: bool, db_dir: str | Path, page_cache: str = "drop") -> None:
        self.page_cache = page_cache
        self.roots: list[int] = []
        self.note = ""
        if in_process:
            self.roots = [os.getpid()]
        else:
            self.roots, self.note = _server_pids(Path(db_dir))
        self.state, self.state_note = "warm", ""
        self.last: IoWindow | None = None

    def prepare(self) -> None:
        """Before a setting (before its warm-up): drop the page cache where allowed and configured."""
        if not self.roots:
            self.state, self.state_note = "warm", self.note or "no database process on this host"
        elif self.page_cache != "drop":
            self.state, self.state_note = "warm", "page cache kept (vdb.query.page_cache: keep)"
        else:
            refused = drop_page_cache()
            self.state, self.state_note = ("warm", refused) if refused else ("cold", "")

    def _processes(self, roots: list[int] | None = None) -> list[psutil.Process]:
        procs = []
        for pid in self.roots if roots is None else roots:
            try:
                root = psutil.Process(pid)
                procs += [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
        return procs

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        """Counters of the database processes before and after the body; the delta goes to ``last``."""
        procs = self._processes()
        # The benchmark's own CPU: the database's processes, this task and its client processes.
        ours = {p.pid: p for p in [*procs, *self._processes([os.getpid()])]}
        start = {p.pid: _counters(p) for p in procs}
        reset = {p.pid: _reset_hwm(p) for p in procs if start[p.pid] is not None}
        host_before, ours_before = _busy_cpu_s(), {pid: _cpu_s(p) for pid, p in ours.items()}
        began = time.monotonic()
        yield
        window_s = time.monotonic() - began
        host_used = _busy_cpu_s() - host_before
        ours_used = sum(
            after - before
            for pid, before in ours_before.items()
            if before is not None and (after := _cpu_s(ours[pid])) is not None
        )
        totals: dict[str, int] = {"read_bytes": 0, "read_calls": 0, "read_chars": 0, "peak_rss_bytes": 0}
        counted = 0
        for proc in procs:
            before, after = start[proc.pid], _counters(proc)
            if before is None or after is None:
                continue  # exited or unreadable: its share is unknown
            counted += 1
            for key in ("read_bytes", "read_calls", "read_chars"):
                totals[key] += after[key] - before[key]
            peak = _hwm(proc) if reset.get(proc.pid) else None
            totals["peak_rss_bytes"] += peak if peak is not None else max(before["rss"], after["rss"])
        values: dict[str, Any] = dict(totals) if counted else {}
        # Only where the database's processes are known here: servers elsewhere, attached or started by a
        # batch job on this very machine (the Slurm testbed's nodes) cannot be told from a neighbour.
        others = round(max(host_used - ours_used, 0.0), 3) if self.roots else None
        self.last = IoWindow(
            page_cache=self.state,
            page_cache_note=self.state_note,
            processes=counted,
            window_s=window_s,
            host_cpus=psutil.cpu_count(),
            others_cpu_s=others,
            **values,
        )

    def metadata(self, meta: dict[str, str] | None) -> dict[str, str]:
        """The raw file's metadata with the last window added (key ``io``)."""
        out = dict(meta or {})
        if self.last is not None:
            out[IO_KEY] = self.last.model_dump_json()
        return out


def _counters(proc: psutil.Process) -> dict[str, int] | None:
    try:
        with proc.oneshot():
            io = proc.io_counters()
            rss = proc.memory_info().rss
    except (psutil.Error, AttributeError):
        return None
    return {"read_bytes": io.read_bytes, "read_calls": io.read_count, "read_chars": io.read_chars, "rss": rss}


def _busy_cpu_s() -> float:
    """CPU seconds this host has spent busy since boot, over every CPU (idle and I/O wait excluded)."""
    times = psutil.cpu_times()  # guest time is already inside user and nice on Linux
    busy = ("user", "nice", "system", "irq", "softirq", "steal")
    return sum(getattr(times, name, 0.0) for name in busy)


def _cpu_s(proc: psutil.Process) -> float | None:
    """User + system CPU seconds of ``proc``; None once it is gone."""
    try:
        used = proc.cpu_times()
    except psutil.Error:
        return None
    return used.user + used.system


def _server_pids(db_dir: Path) -> tuple[list[int], str]:
    """The server pids the runner recorded for this database, when they run on this host."""
    path = db_dir / SERVER_PIDS
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return [], f"no server pids recorded ({path.name} missing)"
    if recorded.get("host") != socket.gethostname():
        return [], f"servers run on {recorded.get('host')}, not on this host"
    pids = [int(p) for p in (recorded.get("pids") or {}).values()]
    return pids, "" if pids else "no local server process (attached or remote)"


# ---------------------------------------------------------------------------------------------------------
# Evaluation: the raw file's io metadata -> result columns
# ---------------------------------------------------------------------------------------------------------


def read_window(path: str | Path) -> IoWindow | None:
    """The io window recorded in a raw query file's metadata, None for files written without one."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    raw = meta.get(IO_KEY.encode())
    return IoWindow.model_validate_json(raw) if raw else None


def disturbed_note(rows: list[dict[str, Any]], name: Any) -> str | None:
    """One sentence naming the rows (query rows, each shown as ``name(row)``) measured while other
    processes kept at least :data:`BUSY_CORES` of the host busy; None when none was."""
    busy = [r for r in rows if (r.get("other_cpu_cores") or 0.0) >= BUSY_CORES]
    if not busy:
        return None
    shown = ", ".join(f"{name(r)} ({r['other_cpu_cores']:.1f} cores)" for r in busy[:5])
    more = f" and {len(busy) - 5} more" if len(busy) > 5 else ""
    return (
        f"measured beside a busy neighbour: processes other than the benchmark's kept the client's host "
        f"busy during {shown}{more}, on average; their QPS and latency may tell of that neighbour, not of "
        "the database: measure them on a quiet host"
    )


def io_columns(row: dict[str, Any], window: IoWindow | None) -> dict[str, Any]:
    """Result columns of one evaluated query row (``queries_sent``, ``qps``) from its io window."""
    if window is None:
        return {}
    queries = row.get("queries_sent") or 0  # every request of the window, repeats of a query included
    qps = row.get("qps")

    def per_query(value: int | None) -> float | None:
        return value / queries if value is not None and queries else None

    peak = window.peak_rss_bytes
    others = window.others_cpu_s
    return {
        "other_cpu_cores": others / window.window_s if others is not None and window.window_s else None,
        "page_cache": window.page_cache,
        "bytes_read_per_query": per_query(window.read_bytes),
        "read_calls_per_query": per_query(window.read_calls),
        "peak_rss_bytes": peak,
        "qps_per_gb": qps / (peak / GB) if peak and qps is not None else None,
    }
