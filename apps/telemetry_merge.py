"""The pilot ranks' telemetry merged into a point's ``telemetry.parquet``, phases assigned by time.

On HPC each rank script runs ``python -m apps.telemetry --rank N`` beside its server (``lib.sh``
``vdb_telemetry_start``) and writes ``<cluster dir>/telemetry/rank-NNN.parquet`` when the rank stops. That
sampler runs on the database node, in another job than the driver: it cannot know which benchmark phase
the driver is in, so its rows carry the placeholder phase ``run``. The driver's
:class:`~apps.telemetry.DatabaseTelemetry` keeps the wall-clock time of every phase switch
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
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from apps.telemetry import TELEMETRY_SCHEMA
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
