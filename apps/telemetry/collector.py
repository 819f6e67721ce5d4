"""The driver side of telemetry: a database's phases, its sampled processes, and the pilot ranks' rows.

:class:`DatabaseTelemetry` is what the vdb runner uses: phases ``deploy``, ``insert``, ``index``, ``query``,
``mixed`` and ``teardown``, ``<point dir>/telemetry.parquet``, and ``server_pids.json`` (the server pids
and their host, read by the query stage's exact per-setting I/O counters, :mod:`apps.vdb.stages.query_io`). It
never raises: a failed sample or write is logged and the benchmark goes on.

On HPC the servers run on other nodes through a pilot job; the driver cannot read their ``/proc``. Each
rank script starts ``python -m apps.telemetry --pids <server pid> --out <cluster>/telemetry/rank-NNN.parquet
--rank N`` beside its server (``lib.sh`` ``vdb_telemetry_start``, ``vdb.cluster.telemetry``) and stops it
when the rank stops; after teardown :meth:`DatabaseTelemetry.stop` merges those files into the point's
``telemetry.parquet``, their phases assigned from the driver's phase switch times
(:mod:`apps.telemetry.collector`).

## The pilot ranks' rows

The pilot ranks' telemetry merged into a point's ``telemetry.parquet``, phases assigned by time.

On HPC each rank script runs ``python -m apps.telemetry --rank N`` beside its server (``lib.sh``
``vdb_telemetry_start``) and writes ``<cluster dir>/telemetry/rank-NNN.parquet`` when the rank stops. That
sampler runs on the database node, in another job than the driver: it cannot know which benchmark phase
the driver is in, so its rows carry the placeholder phase ``run``. The driver's
:class:`~apps.telemetry.collector.DatabaseTelemetry` keeps the wall-clock time of every phase switch
(``switches``); here each rank row gets the phase whose switch is the last one at or before the row's
``time`` (rows before the first switch: the first phase, ``deploy``; after the last: the last,
``teardown``). The nodes' clocks are NTP-synchronised on the machines this targets, so a row may be
mislabelled only within the clock offset (milliseconds) of a switch; a once-a-second series cannot
resolve finer anyway.

Rank rows keep their ``node`` (the node name the rank registered) and ``rank``; the rank's server process
is role ``server`` and its children (the database inside Apptainer) role ``child``, as for local servers.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from apps.telemetry.sampler import TELEMETRY_SCHEMA, Roots, Sampler, engine_pids, write_server_pids
from core.store import write_parquet_atomic

log = logging.getLogger(__name__)


def phase_at(switches: Sequence[tuple[float, str]], times: Sequence[float]) -> list[str]:
    """The driver's phase at each of ``times``: that of the last switch at or before it.

    ``switches`` are ``(time, phase)`` in the order they happened (``DatabaseTelemetry.switches``).
    """
    if not switches:
        raise ValueError("no phase switches recorded: cannot label the ranks' telemetry")
    starts = [t for t, _ in switches]
    names = [p for _, p in switches]
    return [names[max(0, bisect.bisect_right(starts, t) - 1)] for t in times]


def read_rank_file(path: Path, switches: Sequence[tuple[float, str]]) -> pa.Table:
    """One rank's rows, relabelled with the driver's phases, in :data:`TELEMETRY_SCHEMA`."""
    table = pq.read_table(path)
    missing = [f.name for f in TELEMETRY_SCHEMA if f.name not in table.column_names]
    if missing:
        raise ValueError(f"{path}: not a telemetry file (missing columns {', '.join(missing)})")
    table = table.select(TELEMETRY_SCHEMA.names).cast(TELEMETRY_SCHEMA)
    phases = pa.array(phase_at(switches, table.column("time").to_pylist()), pa.string())
    index = TELEMETRY_SCHEMA.get_field_index("phase")
    return table.set_column(index, TELEMETRY_SCHEMA.field(index), phases)


def merge_rank_files(out: Path, rank_files: Sequence[Path], switches: Sequence[tuple[float, str]]) -> int:
    """Append the rows of ``rank_files`` to ``out`` (the driver's own file, if written); rows added.

    A rank file that cannot be read is logged and left out (telemetry never fails the benchmark); ``out``
    is rewritten atomically, sorted by time.
    """
    tables = []
    if out.is_file():
        tables.append(pq.read_table(out).cast(TELEMETRY_SCHEMA))
    added = 0
    for path in sorted(rank_files):
        try:
            table = read_rank_file(path, switches)
        except (OSError, ValueError, pa.ArrowException) as exc:
            log.warning("telemetry: rank file %s left out: %s", path, exc)
            continue
        tables.append(table)
        added += table.num_rows
    if not tables:
        return 0
    merged = pa.concat_tables(tables).sort_by([("time", "ascending"), ("rank", "ascending")])
    write_parquet_atomic(merged, out, row_group_rows=65536)
    return added


class DatabaseTelemetry:
    """The runner's telemetry of one database: phases, engine discovery, never an exception.

    ``start()`` before deploy, ``attach(endpoints)`` once healthy, ``phase(name)`` at each stage and
    ``stop()`` in the ``finally`` after teardown; writes ``<db_dir>/telemetry.parquet``.

    ``rank_files``: the Parquet files a pilot's rank samplers wrote (``ClusterDeployment.telemetry_files``),
    asked after teardown and merged into the same file; ``switches`` keeps the time of every phase change
    to label their rows (a rank's sampler cannot know the driver's phases).
    """

    def __init__(
        self,
        db_dir: Path,
        server_pids: Callable[[], dict[str, int]],
        interval: float = 1.0,
        rank_files: Callable[[], list[Path]] | None = None,
    ):
        self.db_dir, self.server_pids, self.rank_files = db_dir, server_pids, rank_files
        self.data_dir: str | None = None
        self.switches: list[tuple[float, str]] = []  # (time.time(), phase) of every phase change
        self.sampler = Sampler(self._roots, db_dir / "telemetry.parquet", interval)

    def _roots(self) -> Roots:
        roots = {name: (pid, "server") for name, pid in self.server_pids().items()}
        if self.data_dir is not None:
            roots.update({f"engine-{pid}": (pid, "engine") for pid in engine_pids(self.data_dir)})
        return roots

    def start(self) -> None:
        """Start sampling in phase ``deploy`` (servers are picked up as the deployment starts them)."""
        self.switches.append((time.time(), "deploy"))
        self._guard("start", lambda: self.sampler.start("deploy"))

    def attach(self, endpoints: Any) -> None:
        """After deploy: record the server pids for the query stage; watch an in-process engine."""

        def attach() -> None:
            if endpoints.in_process:
                self.data_dir = endpoints.data_dir
            write_server_pids(self.db_dir, self.server_pids())

        self._guard("attach", attach)

    def phase(self, name: str) -> None:
        """Label the samples from now on with phase ``name``."""
        self.switches.append((time.time(), name))
        self._guard("phase", lambda: self.sampler.set_phase(name))

    def stop(self) -> None:
        """Stop the thread and write the Parquet file, with the pilot ranks' rows when there are any
        (errors logged: a stage's error stays visible)."""
        self._guard("stop", self.sampler.stop)
        if self.rank_files is not None:
            self._guard("merge", self._merge_ranks)

    def _merge_ranks(self) -> None:
        files = self.rank_files() if self.rank_files is not None else []
        if files:
            merge_rank_files(self.sampler.out, files, self.switches)

    def _guard(self, what: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:
            log.error("telemetry %s failed for %s: %s", what, self.db_dir.name, exc)
