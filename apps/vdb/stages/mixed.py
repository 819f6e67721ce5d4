"""The mixed insert + query workload (``vdb.mixed``; ../shared/papers/000 §V-D): measure now, evaluate later.

One Parsl task, after a point's query sweep, on the point's running database:

1. **Preload.** The collection is dropped and created afresh (after the sweep it holds every row; deleting
   the second half would leave tombstones and segments a fresh preload does not have), the first
   ``preload_fraction`` of the point's rows (the dataset's, or its first ``vdb.insert.rows``; row order)
   is inserted, waited for and indexed.
2. **Baseline.** The query clients measure the mixed phase's query setting on the preloaded collection
   alone for ``baseline_duration_s`` (the query sweep's own timed-window code,
   :mod:`apps.vdb.stages.query_sweep`).
3. **Mixed.** Insert client processes send the rest of the point's rows in dataset order, in batches of
   ``insert_batch_size`` dealt to the clients in turn (each paced to its share of ``insert_rate``), while
   query client processes query in a loop. Every client loads its rows and connects first; all start at one
   common instant. Each insert client marks its last acknowledgement with a file; the query clients check
   the marks before every request and stop once all are there, so no query is sent after the last insert
   is acknowledged (up to the check itself). Recorded: per query its request's send and answer time and the
   returned ids (``queries.parquet``); per insert batch its rows and send and acknowledge times
   (``inserts.parquet``).

Nothing is evaluated here: the per-checkpoint ground truth and the metrics are the report stage's
(:mod:`apps.dataset.groundtruth.checkpoints`, :mod:`apps.evaluate.mixed`).
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from apps.dataset.groundtruth.checkpoints import loaded_rows
from apps.dataset.layout import iter_vectors
from apps.vdb.base import DatabaseError
from apps.vdb.pool import ClientPool, client
from apps.vdb.records import DatabaseTarget, QueryRecord, QuerySetting, setting_label
from apps.vdb.stages import open_loop, query_sweep
from apps.vdb.stages.index import build_index
from apps.vdb.stages.insert import prepare_collection, request_size
from apps.vdb.stages.mixed_config import MixedConfig, MixedRecord
from apps.vdb.stages.query_raw import requests_path, requests_table
from core.errors import ArtifactError
from core.store import read_manifest, write_parquet_atomic

RELEASE_AHEAD_S = 0.5  # common start this far ahead of handing out the work (each client must receive it)
# How often a query client looks for the insert clients' end markers: a file system's metadata round trip
# (Lustre on HPC) before every request would be measured as the database's latency; the phase may run on
# this long after the last insert.
MARKER_POLL_S = 0.01
INSERTS_SCHEMA = pa.schema(
    [
        pa.field("client", pa.int32(), nullable=False),
        pa.field("batch", pa.int32(), nullable=False),  # position of the batch in insert order
        pa.field("row_start", pa.int64(), nullable=False),  # rows [row_start, row_stop) of the dataset
        pa.field("row_stop", pa.int64(), nullable=False),
        pa.field("t_send", pa.float64(), nullable=False),  # time.time() the batch's first request went out
        pa.field("t_ack", pa.float64(), nullable=False),  # time.time() its last request was acknowledged
        # when the insert_rate schedule meant it to leave (null: insert_rate max, no schedule)
        pa.field("t_intended", pa.float64(), nullable=True),
    ]
)
_LOADED: dict[str, Any] = {}  # in an insert client process: its batches' rows, loaded before the clock


def preload_rows(total: int, cfg: MixedConfig) -> int:
    """Rows loaded before the phase: ``preload_fraction`` of ``total``, at least ``k``, fewer than all."""
    preload = round(total * cfg.preload_fraction)
    if preload < cfg.k or preload >= total:
        raise ArtifactError(
            f"vdb.mixed.preload_fraction {cfg.preload_fraction} of {total} rows preloads {preload} rows: "
            f"it must be at least k={cfg.k} and leave rows to insert"
        )
    return preload


def batches(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    """Rows ``[start, stop)`` in order as ``(row_start, row_stop)`` batches of ``size``."""
    return [(lo, min(lo + size, stop)) for lo in range(start, stop, size)]


def read_rows(dataset_dir: str, wanted: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, dict]:
    """(ids, vectors, {row_start: slice}) of the rows of ``wanted`` batches, in one pass over the dataset."""
    lo, hi = min(b[0] for b in wanted), max(b[1] for b in wanted)
    keep_ids, keep_vectors, position = [], [], 0
    for ids, vectors in iter_vectors(Path(dataset_dir)):
        if position >= hi:
            break
        end = position + len(ids)
        if end > lo:
            a, b = max(lo, position) - position, min(hi, end) - position
            keep_ids.append(ids[a:b])
            keep_vectors.append(np.array(vectors[a:b], np.float32))
        position = end
    ids, vectors = np.concatenate(keep_ids), np.concatenate(keep_vectors)
    if len(ids) != hi - lo:
        raise ArtifactError(f"{dataset_dir}: rows {lo}..{hi} asked but the dataset ends at row {position}")
    return ids, vectors, {s: slice(s - lo, e - lo) for s, e in wanted}


def load_share(dataset_dir: str, share: list[tuple[int, int]]) -> int:
    """Pool function: load this insert client's batches (off the clock); returns its rows."""
    _LOADED.clear()
    if share:
        ids, vectors, where = read_rows(dataset_dir, share)
        _LOADED.update(ids=ids, vectors=vectors, where=where, share=share)
    return sum(e - s for s, e in share)


def _insert(ids: np.ndarray, vectors: np.ndarray, retries: int) -> None:
    """One batch, split to the client's maximum request size; a failed request is retried (upsert)."""
    db = client()
    size = request_size(len(ids), db)
    for lo in range(0, len(ids), size):
        for attempt in range(retries + 1):
            try:
                db.insert(ids[lo : lo + size], vectors[lo : lo + size])
                break
            except Exception as exc:
                if attempt == retries:
                    raise DatabaseError(f"mixed insert failed after {retries} retries: {exc}") from exc
                time.sleep(min(5.0, 0.2 * 2**attempt))


def send_share(
    release_at: float, rate: float | None, marker: str | None, retries: int = 3
) -> dict[str, list]:
    """Pool function: send the loaded batches in order from ``release_at``, ``rate`` vectors/s (None: as
    fast as acknowledged); touch ``marker`` after the last acknowledgement (also on failure).

    With a rate the batches follow a schedule that does not wait for acknowledgements: batch i is meant to
    leave when the rows before it are due; a late acknowledgement sends the next at once (its intended
    time is recorded, as the open-loop queries' are)."""
    out: dict[str, list] = {"row_start": [], "row_stop": [], "t_send": [], "t_ack": [], "t_intended": []}
    try:
        if not _LOADED:
            return out
        ids, vectors, where = _LOADED["ids"], _LOADED["vectors"], _LOADED["where"]
        time.sleep(max(0.0, release_at - time.time()))
        sent = 0
        for start, stop in _LOADED["share"]:
            intended = None if rate is None else release_at + sent / rate
            if intended is not None:
                time.sleep(max(0.0, intended - time.time()))
            rows = where[start]
            t_send = time.time()
            _insert(ids[rows], vectors[rows], retries)
            out["t_ack"].append(time.time())
            out["t_send"].append(t_send)
            out["t_intended"].append(intended)
            out["row_start"].append(start)
            out["row_stop"].append(stop)
            sent += stop - start
    finally:
        if marker is not None:
            Path(marker).touch()
    return out


class _InsertsDone:
    """Whether every insert client has touched its marker: looked up at most every ``MARKER_POLL_S``."""

    def __init__(self, markers: list[str]) -> None:
        self.waiting = [Path(m) for m in markers]
        self.looked = 0.0

    def __call__(self) -> bool:
        if self.waiting and time.monotonic() - self.looked >= MARKER_POLL_S:
            self.looked = time.monotonic()
            self.waiting = [m for m in self.waiting if not m.exists()]
        return not self.waiting


def query_until(
    vectors: np.ndarray,
    k: int,
    ef: int | None,
    batch_size: int,
    release_at: float,
    markers: list[str],
    deadline: float,
    arrivals: open_loop.ClientArrivals | None = None,
    in_flight: int = 1,
) -> dict[str, Any]:
    """Pool function: cycle through ``vectors`` in batches from ``release_at`` until every insert client's
    ``markers`` exists (looked for every ``MARKER_POLL_S``) or ``deadline``; per request its first query's
    position in the share, size, send and answer time, returned ids and scores.

    ``arrivals``: open loop, this client's schedule: each request goes out at its intended time on one of
    ``in_flight`` threads (:func:`open_loop.send_on_schedule`); per request ``t_intended`` and ``queued``,
    and ``schedule``: every intended time drawn (the driver counts those due before the last insert's
    acknowledgement that were not sent). None: back to back (closed loop)."""
    db = client()
    starts = list(range(0, len(vectors), batch_size))
    if arrivals is not None:
        return _open_until(db, vectors, k, ef, batch_size, release_at, markers, deadline, arrivals, in_flight)
    out: dict[str, Any] = {"first": [], "size": [], "t_start": [], "t_end": [], "ids": [], "scores": []}
    time.sleep(max(0.0, release_at - time.time()))
    n, inserts_done = 0, _InsertsDone(markers)
    while starts and time.time() < deadline:
        if inserts_done():
            break
        first = starts[n % len(starts)]
        batch = vectors[first : first + batch_size]
        t0 = time.time()
        result = db.search(batch, k, ef)
        out["t_end"].append(time.time())
        out["t_start"].append(t0)
        out["first"].append(first)
        out["size"].append(len(batch))
        out["ids"].append(np.asarray(result.ids))
        out["scores"].append(np.asarray(result.scores))
        n += 1
    out["rank"] = db.rank
    out["t_intended"], out["queued"], out["schedule"] = [None] * n, [None] * n, []
    return out


def _open_until(
    db: Any,
    vectors: np.ndarray,
    k: int,
    ef: int | None,
    batch_size: int,
    release_at: float,
    markers: list[str],
    deadline: float,
    arrivals: open_loop.ClientArrivals,
    in_flight: int,
) -> dict[str, Any]:
    """:func:`query_until` in the open loop: the schedule runs until the last insert is acknowledged."""
    starts = list(range(0, len(vectors), batch_size))
    schedule: list[float] = []

    def times() -> Any:  # the intended times, drawn as they are needed (the phase's length is unknown)
        when = release_at
        while True:
            when += arrivals.next_gap()
            schedule.append(when)
            yield when

    def send(number: int) -> Any:
        first = starts[number % len(starts)]
        return db.search(vectors[first : first + batch_size], k, ef)

    gc.freeze()  # no collection pass while sending (collected in the warm-up)
    try:
        sent = open_loop.send_on_schedule(send, times(), in_flight, deadline, stop=_InsertsDone(markers))
    finally:
        gc.unfreeze()
    if sent.error:
        raise DatabaseError(f"mixed workload: a query timed out: {sent.error}")
    firsts = [starts[i % len(starts)] for i in sent.number.tolist()]
    return {
        "first": firsts,
        "size": [len(vectors[f : f + batch_size]) for f in firsts],
        "t_start": sent.t_start.tolist(),
        "t_end": sent.t_end.tolist(),
        "ids": [np.asarray(sent.results[i].ids) for i in sent.number.tolist()],
        "scores": [np.asarray(sent.results[i].scores) for i in sent.number.tolist()],
        "rank": db.rank,
        "t_intended": sent.t_intended.tolist(),
        "queued": sent.queued.tolist(),
        "schedule": schedule,
    }


def _preload(
    target: DatabaseTarget, dataset_dir: str, preload: int, batch_size: int, cfg: MixedConfig
) -> float:
    """Recreate the collection, insert rows [0, preload), wait until searchable, build the index: seconds."""
    started = time.time()
    prepare_collection(target, recreate=True)
    share = batches(0, preload, batch_size)
    with ClientPool(cfg.insert_clients, target) as pool:
        parts = [share[c :: pool.size] for c in range(pool.size)]
        loads = [pool.submit(load_share, dataset_dir, p, client_index=c) for c, p in enumerate(parts)]
        for future in loads:
            future.result()
        sends = [pool.submit(send_share, 0.0, None, None, client_index=c) for c in range(pool.size)]
        for future in sends:
            future.result()
    db = target.open_client()
    try:
        db.create_collection(target.collection)
        db.wait_searchable(preload, cfg.timeout_s)
        if db.count() != preload:
            raise DatabaseError(f"{target.database}: {db.count()} rows after preloading {preload}")
    finally:
        db.close()
    build_index(target, preload, cfg.timeout_s, None)
    return time.time() - started


def mixed_workload(
    target: DatabaseTarget,
    dataset_dir: str,
    queries_file: str,
    cfg: MixedConfig,
    out_dir: str,
    preload_batch_size: int,
    rows: int | None = None,
    _after: Any = None,
) -> MixedRecord:
    """Parsl task: preload, baseline, mixed phase (module docstring); raw files under ``<out_dir>/mixed``.

    ``rows`` (``vdb.insert.rows``) limits the workload to the dataset's first rows, as the point's own load
    is: the preloaded fraction and the inserts are of that prefix. ``_after`` only orders this task after
    the query sweep.
    """
    out = Path(out_dir) / "mixed"
    out.mkdir(parents=True, exist_ok=True)
    total = loaded_rows(read_manifest(Path(dataset_dir))["rows"], rows)
    preload = preload_rows(total, cfg)
    preload_s = _preload(target, dataset_dir, preload, preload_batch_size, cfg)
    query_ids, vectors = query_sweep.read_queries(queries_file, cfg.max_queries)
    inserted = batches(preload, total, cfg.insert_batch_size)
    rate = None if cfg.insert_rate == "max" else float(cfg.insert_rate)
    with ClientPool(cfg.query_clients, target) as queries, ClientPool(cfg.insert_clients, target) as inserts:
        setting = QuerySetting(
            ef=cfg.ef, batch_size=cfg.query_batch_size, clients=queries.size, k=cfg.k, rate=cfg.query_rate
        )
        baseline = _baseline(target, queries, setting, query_ids, vectors, cfg, str(out / "baseline"))
        shares = np.array_split(np.arange(len(query_ids)), queries.size)
        inserts.warm()  # every insert client connected and attached before the clock
        warm = [
            queries.submit(
                query_sweep.warm_open_share,
                vectors[s[: cfg.warmup_queries]],
                cfg.k,
                cfg.ef,
                cfg.query_batch_size,
                i,
                client_index=i,
            )
            for i, s in enumerate(shares)
        ]
        loads = [
            inserts.submit(load_share, dataset_dir, inserted[c :: inserts.size], client_index=c)
            for c in range(inserts.size)
        ]
        for future in warm + loads:
            future.result()
        markers = [str(out / f"inserted.{c}") for c in range(inserts.size)]
        for marker in markers:
            Path(marker).unlink(missing_ok=True)
        release_at = time.time() + RELEASE_AHEAD_S
        per_client = None if rate is None else rate / inserts.size
        sent = [
            inserts.submit(send_share, release_at, per_client, m, client_index=c)
            for c, m in enumerate(markers)
        ]
        asked = [
            queries.submit(
                query_until,
                vectors[s],
                cfg.k,
                cfg.ef,
                cfg.query_batch_size,
                release_at,
                markers,
                release_at + cfg.timeout_s,
                _arrivals(cfg, queries.size, i),
                cfg.in_flight,
                client_index=i,
            )
            for i, s in enumerate(shares)
        ]
        try:
            acks = [f.result() for f in sent]
        finally:
            for marker in markers:  # the query clients stop even when an insert client failed
                Path(marker).touch()
        answers = [f.result() for f in asked]
    insert_table = _inserts_table(acks, inserted)
    if insert_table.num_rows != len(inserted):
        raise DatabaseError(
            f"{target.database}: {insert_table.num_rows} of {len(inserted)} insert batches acknowledged"
        )
    query_table = _queries_table(target.database, setting, answers, shares, query_ids)
    last_ack = float(max(insert_table.column("t_ack").to_pylist()))  # the phase's end, by this clock
    inserts_file, queries_path = out / "inserts.parquet", out / "queries.parquet"
    write_parquet_atomic(insert_table, inserts_file, row_group_rows=65536)
    write_parquet_atomic(_requests_table(answers), requests_path(queries_path), row_group_rows=65536)
    write_parquet_atomic(query_table, queries_path, row_group_rows=8192)
    return MixedRecord(
        preload_rows=preload,
        total_rows=total,
        setting=setting.label,
        insert_setting=setting_label(None, cfg.insert_batch_size, inserts.size),
        insert_rate=rate,
        checkpoint_fraction=cfg.checkpoint_fraction,
        preload_s=preload_s,
        baseline_file=baseline.file,
        baseline_requests_file=str(requests_path(Path(baseline.file))),
        queries_file=str(queries_path),
        inserts_file=str(inserts_file),
        last_ack=last_ack,
        query_rate=cfg.query_rate,
        released_at=release_at,
        max_lag_ms=cfg.max_lag_ms if cfg.query_rate else None,
        queries_unsent=_unsent(answers, last_ack) if cfg.query_rate else None,
    )


def _unsent(answers: list[dict[str, Any]], last_ack: float) -> int:
    """Open-loop queries due before the phase ended (the last insert acknowledged) that were not sent:
    intended times before it, less the requests sent for them (those sent for later ones, in the moment
    the clients take to see the end, make up for none)."""
    unsent = 0
    for answer in answers:
        due = np.asarray(answer["schedule"], float)
        sent = np.asarray([t for t in answer["t_intended"] if t is not None], float)
        unsent += max(0, int(np.count_nonzero(due < last_ack)) - int(np.count_nonzero(sent < last_ack)))
    return unsent


def _arrivals(cfg: MixedConfig, clients: int, index: int) -> open_loop.ClientArrivals | None:
    """Query client ``index``'s open-loop schedule in the mixed phase (None: closed loop); its seed differs
    from the baseline's so the two phases do not share arrival times."""
    if cfg.query_rate is None:
        return None
    return open_loop.ClientArrivals(cfg.query_rate, clients, index, cfg.arrivals, cfg.seed + 1)


def _baseline(
    target: DatabaseTarget,
    queries: ClientPool,
    setting: QuerySetting,
    query_ids: np.ndarray,
    vectors: np.ndarray,
    cfg: MixedConfig,
    out: str,
) -> QueryRecord:
    """The query setting on the preloaded collection alone for ``baseline_duration_s``: the sweep's timed
    window (closed loop), or its open-loop window at ``query_rate``."""
    if cfg.query_rate is None:
        parts, requests, stall = query_sweep._measure(
            queries, setting, query_ids, vectors, cfg.warmup_queries, cfg.baseline_duration_s
        )
        return query_sweep._write_setting(target.database, setting, parts, requests, stall, out)
    duration = cfg.baseline_duration_s
    offsets = open_loop.arrival_offsets(cfg.query_rate, duration, cfg.arrivals, cfg.seed)
    parts, requests, stall = query_sweep._measure_open(
        queries, setting, query_ids, vectors, cfg.warmup_queries, offsets, duration, cfg.in_flight
    )
    schedule = open_loop.schedule_meta(
        cfg.query_rate, cfg.arrivals, cfg.seed, duration, len(offsets), cfg.max_lag_ms
    )
    return query_sweep._write_setting(
        target.database, setting, parts, requests, stall, out, open_meta=schedule
    )


def _requests_table(answers: list[dict]) -> pa.Table:
    """Every request of the mixed phase (:data:`apps.vdb.stages.query_raw.REQUEST_SCHEMA`), with its
    intended send time in the open loop."""
    names = ("client", "rank", "request", "queries", "t_start", "t_end", "t_intended", "queued")
    column: dict[str, list] = {n: [] for n in names}
    for c, answer in enumerate(answers):
        n = len(answer["t_start"])
        column["client"] += [c] * n
        column["rank"] += [answer["rank"]] * n
        column["request"] += list(range(n))
        column["queries"] += answer["size"]
        column["t_start"] += answer["t_start"]
        column["t_end"] += answer["t_end"]
        column["t_intended"] += answer["t_intended"]
        column["queued"] += answer["queued"]
    open_loop_phase = any(t is not None for t in column["t_intended"])
    return requests_table(
        column["client"],
        column["rank"],
        column["request"],
        column["queries"],
        column["t_start"],
        column["t_end"],
        column["t_intended"] if open_loop_phase else None,
        column["queued"] if open_loop_phase else None,
    )


def _inserts_table(acks: list[dict[str, list]], inserted: list[tuple[int, int]]) -> pa.Table:
    """Per insert batch: client, its position in insert order, rows, send and acknowledge times."""
    number = {start: i for i, (start, _) in enumerate(inserted)}
    rows = [
        (c, number[s], s, e, ts, ta, ti)
        for c, part in enumerate(acks)
        for s, e, ts, ta, ti in zip(
            part["row_start"],
            part["row_stop"],
            part["t_send"],
            part["t_ack"],
            part["t_intended"],
            strict=True,
        )
    ]
    rows.sort(key=lambda r: r[1])
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in INSERTS_SCHEMA.names]
    return pa.table(dict(zip(INSERTS_SCHEMA.names, map(list, columns), strict=True)), schema=INSERTS_SCHEMA)


def _queries_table(
    database: str, setting: QuerySetting, answers: list[dict], shares: list[np.ndarray], query_ids: np.ndarray
) -> pa.Table:
    """One row per query sent in the mixed phase (:data:`apps.vdb.stages.query_raw.RAW_QUERY_SCHEMA`)."""
    columns: dict[str, list] = {n: [] for n in ("client", "rank", "request", "query_ids", "ids", "scores")}
    t_start: list[float] = []
    t_end: list[float] = []
    for c, (answer, share) in enumerate(zip(answers, shares, strict=True)):
        for r, (first, size) in enumerate(zip(answer["first"], answer["size"], strict=True)):
            columns["query_ids"] += query_ids[share[first : first + size]].tolist()
            columns["ids"] += np.asarray(answer["ids"][r]).tolist()
            columns["scores"] += np.asarray(answer["scores"][r]).tolist()
            columns["client"] += [c] * size
            columns["rank"] += [answer["rank"]] * size
            columns["request"] += [r] * size
            t_start += [answer["t_start"][r]] * size
            t_end += [answer["t_end"][r]] * size
    return query_sweep.setting_raw_table(database, setting, t_start=t_start, t_end=t_end, **columns)
