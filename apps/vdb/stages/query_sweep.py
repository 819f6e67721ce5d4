"""The query stage: run every setting of the sweep and store raw results (measure now, evaluate later).

A setting is (ef, batch size, clients, k). The query set is split across the client processes; each sends
its share in batches of ``batch_size``, cycling through it for ``duration_s`` seconds (at least one full
pass; ``duration_s: None`` sends it once). Two files per setting: ``raw/<setting>.parquet`` holds the first
answer to each distinct query (returned ids and scores, its request's start and end: recall rests on each
distinct query once), ``raw/<setting>.requests.parquet`` every request of the window (QPS and latency rest
on all of them), so a long window stores ~30 bytes per request, not every returned id. Client ``i`` talks
to entry rank ``i % ranks`` (``Endpoints.entry``) and its rows record that rank.

The clients start together: first every client connects and sends its warm-up queries (:func:`warm_share`;
process start-up, imports and connecting stay off the clock), then all are released at one common instant
(:func:`run_share` ``release_at``), so the QPS window does not hold the skew between client starts.

Metrics (QPS, latency percentiles, recall) are computed afterwards from these raw Parquet files by
:mod:`apps.evaluate.metrics`, so a metric can be corrected without re-running a cluster.

A setting that stalls (a request timed out, or took > 20× the setting's median and > 1 s: a frozen or
overloaded server) is run once more; if it stalls again its raw file is flagged (``stalled`` in the file's
metadata and in its :class:`QueryRecord`) and the report marks it instead of presenting a normal figure.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import logging
import math
import time
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from apps.dataset.layout import arrow_to_vectors
from apps.vdb.base import SEARCH_KNOB, RequestTimeout
from apps.vdb.config import QuerySweepConfig
from apps.vdb.pool import ClientPool, client, reset_client
from apps.vdb.records import DatabaseTarget, IndexRecord, QueryRecord, QuerySetting
from apps.vdb.stages import open_loop
from apps.vdb.stages.query_io import QueryIo
from apps.vdb.stages.query_raw import OPEN_LOOP_META, raw_query_table, requests_path, requests_table
from core.errors import ArtifactError
from core.store import read_store_table, write_parquet_atomic

log = logging.getLogger(__name__)
STALL_FACTOR, STALL_MIN_S = 20.0, 1.0  # a request this much slower than the median is a stall
ATTEMPTS = 2  # a stalled setting is run once more before it is flagged
# The common start is this far ahead of handing out the shares: enough for each client process to receive
# its share (a pickled slice of the query set) and be waiting when the instant comes.
RELEASE_AHEAD_S = 0.25


def measured_clients(query_cfg: QuerySweepConfig, in_process: bool = False) -> list[int]:
    """The client counts a sweep measures: an in-process engine serves one client, whatever is asked."""
    return [1] if in_process else sorted(set(query_cfg.clients))


def sweep(query_cfg: QuerySweepConfig, index_type: str, in_process: bool = False) -> list[QuerySetting]:
    """Every setting of the sweep, grouped by clients (pool reuse).

    Each closed-loop setting is followed by its open-loop settings, one per offered rate (``rate: auto``
    adds its steps at run time). ef only varies for indexes with a search-time knob (for IVF it is
    nprobe). An in-process engine serves one client, so its sweep has clients = 1 only rather than
    repeating the same setting.
    """
    efs = query_cfg.ef if index_type in SEARCH_KNOB else [None]
    clients = measured_clients(query_cfg, in_process)
    rates = query_cfg.rate if isinstance(query_cfg.rate, list) else []
    return [
        QuerySetting(ef=ef, batch_size=b, clients=c, k=k, rate=rate)
        for c, ef, b, k in itertools.product(clients, efs, query_cfg.batch_size, query_cfg.k)
        for rate in [None, *rates]
    ]


def warm_open_share(vectors: np.ndarray, k: int, ef: int | None, batch_size: int, index: int) -> str | None:
    """Pool function, phase 1 of an open-loop setting: :func:`warm_share`, then a full garbage collection,
    so that the client is ready to send when its first arrival is due (a collection in every client
    process at the release would make the first arrivals late)."""
    stall = warm_share(vectors, k, ef, batch_size, index)
    gc.collect()
    return stall


def warm_share(vectors: np.ndarray, k: int, ef: int | None, batch_size: int, index: int) -> str | None:
    """Pool function, phase 1 of a setting: connect this client and send its warm-up ``vectors``.

    Returns None, or why it stalled (a request timeout; the connection is then dropped).
    """
    try:
        db = client()
        for start in range(0, len(vectors), batch_size):
            db.search(vectors[start : start + batch_size], k, ef)
    except RequestTimeout as exc:
        reset_client()
        return f"client {index}: {exc}"
    return None


ROW_KEYS = ("client", "rank", "request", "query_ids", "ids", "scores", "t_start", "t_end")
REQUEST_KEYS = ("client", "rank", "request", "queries", "t_start", "t_end")


def empty_rows() -> dict[str, list]:
    """The per-query rows of a share, with no query yet."""
    return {key: [] for key in ROW_KEYS}


def empty_requests() -> dict[str, np.ndarray]:
    """The per-request arrays of a share, with no request yet."""
    return {key: np.zeros(0) for key in REQUEST_KEYS}


def run_share(
    query_ids: np.ndarray,
    vectors: np.ndarray,
    k: int,
    ef: int | None,
    batch_size: int,
    warmup: int,
    index: int,
    release_at: float | None = None,
    duration_s: float | None = None,
) -> tuple[dict[str, list], dict[str, np.ndarray], str | None]:
    """Pool function: one client's share of a setting. Returns ``(rows, requests, stall)``.

    The first ``warmup`` queries are sent unrecorded first; then, when ``release_at`` is given, the share
    waits until that ``time.time()`` (the common start of every client of the setting). Without
    ``duration_s`` the share is sent once; with it, the client cycles through its share until
    ``duration_s`` seconds have passed since its first request and it has sent the share at least once.
    ``rows``: one per distinct query, the first answer to it (ids, scores, its request's timing);
    ``requests``: every request's timing as compact arrays (client, rank, request, queries, t_start,
    t_end). On a request timeout the share stops there and ``stall`` says why (rows and requests hold
    what was answered before it); the connection is dropped so a late answer cannot leak into the next
    attempt.
    """
    rows = empty_rows()
    stall = warm_share(vectors[: min(warmup, len(vectors))], k, ef, batch_size, index)
    if stall:
        return rows, empty_requests(), stall
    # While measuring, keep per request only numpy arrays and compact float arrays (no new objects the
    # cyclic garbage collector tracks) and freeze what exists: a collection pass is a latency spike.
    ids: list[np.ndarray] = []
    scores: list[np.ndarray] = []
    t_start, t_end = array("d"), array("d")
    starts = list(range(0, len(vectors), batch_size))
    per_pass = len(starts)
    rank = None
    gc.collect()
    gc.freeze()
    try:
        db = client()
        search, rank = db.search, db.rank
        if release_at is not None:
            time.sleep(max(0.0, release_at - time.time()))
        deadline = math.inf
        sent = 0
        while per_pass and (sent < per_pass or (duration_s is not None and t_end[-1] < deadline)):
            start = starts[sent % per_pass]
            batch = vectors[start : start + batch_size]
            t0 = time.time()
            result = search(batch, k, ef)
            t1 = time.time()
            if sent < per_pass:
                ids.append(result.ids)
                scores.append(result.scores)
                if sent == 0 and duration_s is not None:
                    deadline = t0 + duration_s
            t_start.append(t0)
            t_end.append(t1)
            sent += 1
    except RequestTimeout as exc:
        reset_client()
        stall = f"client {index}: {exc}"
    finally:
        gc.unfreeze()
    rows, requests = _share_result(query_ids, vectors, batch_size, index, rank, ids, scores, t_start, t_end)
    return rows, requests, stall


def _share_result(
    query_ids: np.ndarray,
    vectors: np.ndarray,
    batch_size: int,
    index: int,
    rank: int | None,
    ids: list[np.ndarray],
    scores: list[np.ndarray],
    t_start: array,
    t_end: array,
    t_intended: array | None = None,
) -> tuple[dict[str, list], dict[str, np.ndarray]]:
    """A share's rows (first answer per distinct query) and its requests' arrays, from what it recorded."""
    first_pass = len(ids)
    rows = empty_rows()
    rows["t_start"], rows["t_end"] = list(t_start[:first_pass]), list(t_end[:first_pass])
    rows = _fill_rows(rows, query_ids, ids, scores, index, rank if ids else None)
    n = len(t_start)
    starts = range(0, len(vectors), batch_size)
    sizes = np.array([min(batch_size, len(vectors) - s) for s in starts] or [0], np.int32)
    requests = {
        "client": np.full(n, index, np.int32),
        "rank": np.full(n, -1 if rank is None else rank, np.int32),
        "request": np.arange(n, dtype=np.int32),
        "queries": np.resize(sizes, n),
        "t_start": np.frombuffer(t_start, np.float64) if n else np.zeros(0),
        "t_end": np.frombuffer(t_end, np.float64) if n else np.zeros(0),
    }
    if t_intended is not None:
        requests["t_intended"] = np.frombuffer(t_intended, np.float64) if n else np.zeros(0)
    return rows, requests


def run_open_share(
    query_ids: np.ndarray,
    vectors: np.ndarray,
    k: int,
    ef: int | None,
    batch_size: int,
    index: int,
    release_at: float,
    offsets: np.ndarray,
    deadline: float,
    in_flight: int = 1,
) -> tuple[dict[str, list], dict[str, np.ndarray], str | None]:
    """Pool function: one client's share of an open-loop setting (:mod:`apps.vdb.stages.open_loop`).

    Request i is meant to leave at ``release_at + offsets[i]``; it goes out then on one of ``in_flight``
    threads sharing this process's connection (or waits for one, marked ``queued``). The client cycles
    through its share of the queries and stops at ``deadline`` (``time.time()``) with the rest unsent.
    Returns ``(rows, requests, stall)`` as :func:`run_share` does, the requests with ``t_intended`` and
    ``queued``; a request that timed out is recorded ending at its timeout. Warmed up before (phase 1).
    """
    starts = list(range(0, len(vectors), batch_size))
    per_pass = len(starts)
    rank = None
    gc.freeze()  # no collection pass inside the window: it would be a lag spike (collected in warm-up)
    try:
        db = client()
        search, rank = db.search, db.rank

        def send(number: int) -> Any:
            start = starts[number % per_pass]
            return search(vectors[start : start + batch_size], k, ef)

        sent = open_loop.send_on_schedule(
            send, (release_at + offsets).tolist() if per_pass else [], in_flight, deadline, keep=per_pass
        )
    finally:
        gc.unfreeze()
    stall = None
    if sent.error:
        reset_client()
        stall = f"client {index}: {sent.error}"
    first = 0  # the first pass's answers, in order, up to the first missing one
    while first in sent.results:
        first += 1
    answered = [sent.results[i] for i in range(first)]
    rows, requests = _share_result(
        query_ids,
        vectors,
        batch_size,
        index,
        rank,
        [r.ids for r in answered],
        [r.scores for r in answered],
        array("d", sent.t_start.tolist()),
        array("d", sent.t_end.tolist()),
        array("d", sent.t_intended.tolist()),
    )
    requests["request"] = sent.number.astype(np.int32)
    requests["queries"] = np.array(
        [min(batch_size, len(vectors) - starts[i % per_pass]) for i in sent.number], np.int32
    ).reshape(-1)
    requests["queued"] = sent.queued
    return rows, requests, stall


def _fill_rows(
    rows: dict[str, list],
    query_ids: np.ndarray,
    ids: list[np.ndarray],
    scores: list[np.ndarray],
    index: int,
    rank: int | None,
) -> dict[str, list]:
    """Per-query rows from per-request arrays (requests of the share in order, from its first query)."""
    sizes = [len(a) for a in ids]
    n = sum(sizes)
    rows["client"] = [index] * n
    rows["rank"] = [rank] * n
    rows["request"] = np.repeat(np.arange(len(sizes)), sizes).tolist()
    rows["query_ids"] = query_ids[:n].tolist()
    rows["ids"] = [r for a in ids for r in a.tolist()]
    rows["scores"] = [r for a in scores for r in a.tolist()]
    rows["t_start"] = np.repeat(rows["t_start"], sizes).tolist()
    rows["t_end"] = np.repeat(rows["t_end"], sizes).tolist()
    return rows


def slow_request(parts: list[dict[str, Any]]) -> str | None:
    """Why a completed setting counts as stalled: its slowest request took > 20× the median and > 1 s.

    ``parts``: per client, its requests (``t_start``, ``t_end``: one entry per request).
    """
    latency = [np.asarray(p["t_end"], np.float64) - np.asarray(p["t_start"], np.float64) for p in parts]
    values = np.concatenate(latency) if latency else np.zeros(0)
    if not len(values):
        return None
    median, worst = float(np.median(values)), float(values.max())
    if worst > STALL_MIN_S and worst > STALL_FACTOR * median:
        return (
            f"a request took {worst:.1f}s, {worst / max(median, 1e-9):.0f}× the median {median * 1000:.1f} ms"
        )
    return None


def read_queries(queries_file: str, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of the query set, the first ``limit`` when set."""
    table = read_store_table(queries_file, columns=["id", "embedding"])
    if limit:
        table = table.slice(0, limit)
    return table.column("id").to_numpy(), arrow_to_vectors(table.column("embedding"))


def query_sweep(
    target: DatabaseTarget,
    queries_file: str,
    query_cfg: QuerySweepConfig,
    out_dir: str,
    _index: IndexRecord | None,
) -> list[QueryRecord]:
    """Parsl task: run every setting; write ``raw/<setting>.parquet``; return one record per setting.

    ``_index`` only orders this task after the index build.
    """
    collection, database = target.collection, target.database
    ids, vectors = read_queries(queries_file, query_cfg.max_queries)
    if vectors.shape[1] != collection.dim:
        raise ArtifactError(
            f"{queries_file}: queries have dimension {vectors.shape[1]} but the {database} collection has "
            f"{collection.dim}"
        )
    records = []
    probe = QueryIo(target.endpoints.in_process, out_dir, query_cfg.page_cache)  # I/O per query
    settings_list = sweep(query_cfg, collection.index_type, target.endpoints.in_process)
    for clients, group in itertools.groupby(settings_list, key=lambda s: s.clients):
        with ClientPool(clients, target) as pool:
            closed: dict[str, tuple[float, float]] = {}  # closed setting -> (requests/s, median request s)
            for asked in group:
                setting = asked.model_copy(update={"clients": pool.size})
                if setting.rate is not None:
                    base = closed.get(setting.model_copy(update={"rate": None}).label)
                    records.append(
                        _open_setting(pool, target, setting, ids, vectors, query_cfg, out_dir, base)[0]
                    )
                    continue
                probe.prepare()  # drop the page cache before the setting where allowed
                parts, requests, stall = _measure(
                    pool, setting, ids, vectors, query_cfg.warmup_queries, query_cfg.duration_s, probe
                )
                records.append(_write_setting(database, setting, parts, requests, stall, out_dir, probe))
                closed[setting.label] = _closed_pace(requests)
                if query_cfg.rate == "auto":
                    records += _auto_rates(
                        pool, target, setting, ids, vectors, query_cfg, out_dir, closed[setting.label]
                    )
    return records


def _closed_pace(requests: list[dict[str, np.ndarray]]) -> tuple[float, float]:
    """(requests/s, median request in s) of a closed-loop setting's window (NaN without requests): the
    service time the open-loop settings after it are sized with (Little's law)."""
    start = np.concatenate([r["t_start"] for r in requests])
    end = np.concatenate([r["t_end"] for r in requests])
    if not len(start) or end.max() <= start.min():
        return math.nan, math.nan
    return len(start) / float(end.max() - start.min()), float(np.median(end - start))


def _auto_rates(
    pool: ClientPool,
    target: DatabaseTarget,
    setting: QuerySetting,
    ids: np.ndarray,
    vectors: np.ndarray,
    query_cfg: QuerySweepConfig,
    out_dir: str,
    pace: tuple[float, float],
) -> list[QueryRecord]:
    """rate: auto after a closed-loop setting: step the offered rate up from a fraction of its closed-loop
    rate until a step is not served (:func:`open_loop.keeps_up`) or clients run short, then halve the gap
    between the last rate served and the first not served a few times (:data:`open_loop.AUTO_REFINE`),
    so the knee is found to a few percent rather than to one step; one record a rate tried."""
    closed_rate, _ = pace
    if not math.isfinite(closed_rate):
        log.warning(
            "rate: auto after %s: the closed loop measured no rate; no open-loop steps", setting.label
        )
        return []
    records: list[QueryRecord] = []

    def served(rate: float) -> bool:
        step = setting.model_copy(update={"rate": float(f"{rate:.3g}")})
        record, stats = _open_setting(pool, target, step, ids, vectors, query_cfg, out_dir, pace)
        records.append(record)
        return stats is not None and open_loop.keeps_up(stats, query_cfg.p99_bound_ms)

    low, high = None, open_loop.AUTO_START * closed_rate
    for _ in range(open_loop.AUTO_MAX_STEPS):
        if not served(high):
            break
        low, high = high, high * open_loop.AUTO_FACTOR
    else:
        return records  # every step served: no knee below the last one
    for _ in range(open_loop.AUTO_REFINE if low is not None else 0):
        middle = (low + high) / 2
        if served(middle):
            low = middle
        else:
            high = middle
    return records


def _open_setting(
    pool: ClientPool,
    target: DatabaseTarget,
    setting: QuerySetting,
    ids: np.ndarray,
    vectors: np.ndarray,
    query_cfg: QuerySweepConfig,
    out_dir: str,
    pace: tuple[float, float] | None,
) -> tuple[QueryRecord, dict[str, Any] | None]:
    """Measure one open-loop setting and write it; returns its record and its figures (None: not run).

    Not run when the closed-loop setting's service time says its clients cannot offer the rate
    (:func:`open_loop.too_few_clients`): its raw file is written empty, flagged with the reason.
    """
    assert setting.rate is not None
    rate = setting.rate
    per_pass = math.ceil(len(ids) / setting.batch_size)
    duration = query_cfg.duration_s or per_pass / rate
    offsets = open_loop.arrival_offsets(rate, duration, query_cfg.arrivals, query_cfg.seed)
    described = open_loop.schedule_meta(
        rate, query_cfg.arrivals, query_cfg.seed, duration, len(offsets), query_cfg.max_lag_ms
    )
    described["p99_bound_ms"] = query_cfg.p99_bound_ms
    # An in-process engine is searched from its one client thread only.
    in_flight = 1 if target.endpoints.in_process else query_cfg.in_flight
    described["in_flight"] = in_flight
    short = None
    if pace is not None and math.isfinite(pace[1]):
        senders = setting.clients * in_flight
        short = open_loop.too_few_clients(rate, senders, pace[1], "the closed loop's median request,")
    database = target.database
    if short:
        log.warning("open-loop setting %s not run: %s", setting.label, short)
        record = _write_setting(
            database,
            setting,
            [empty_rows()],
            [_empty_open()],
            None,
            out_dir,
            open_meta=described,
            not_run=short,
        )
        return record, None
    parts, requests, stall = _measure_open(
        pool, setting, ids, vectors, query_cfg.warmup_queries, offsets, duration, in_flight
    )
    record = _write_setting(database, setting, parts, requests, stall, out_dir, open_meta=described)
    if stall or not any(len(r["t_end"]) for r in requests):
        return record, None
    joined = {key: np.concatenate([r[key] for r in requests]) for key in (*REQUEST_KEYS, *OPEN_KEYS)}
    table = requests_table(
        joined["client"],
        [None] * len(joined["client"]),
        joined["request"],
        joined["queries"],
        joined["t_start"],
        joined["t_end"],
        joined["t_intended"],
        joined["queued"],
    )
    return record, open_loop.open_loop_stats(table, rate, len(offsets), duration, query_cfg.max_lag_ms)


OPEN_KEYS = ("t_intended", "queued")  # what an open-loop share's requests add


def _empty_open() -> dict[str, np.ndarray]:
    return {**empty_requests(), "t_intended": np.zeros(0), "queued": np.zeros(0, bool)}


def _measure_open(
    pool: ClientPool,
    setting: QuerySetting,
    ids: np.ndarray,
    vectors: np.ndarray,
    warmup: int,
    offsets: np.ndarray,
    duration_s: float,
    in_flight: int = 1,
) -> tuple[list[dict[str, list]], list[dict[str, np.ndarray]], str | None]:
    """Run one open-loop setting over every client: warm up, then release every client at one instant
    with its dealt arrival times, ``in_flight`` senders each. Not repeated on a stall: queueing behind a
    stall is what it measures."""
    shares = np.array_split(np.arange(len(ids)), pool.size)
    args = (setting.k, setting.ef, setting.batch_size)
    warm = [
        pool.submit(warm_open_share, vectors[s[:warmup]], *args, i, client_index=i)
        for i, s in enumerate(shares)
    ]
    timeouts = [why for why in (f.result() for f in warm) if why]
    if timeouts:
        return [empty_rows() for _ in shares], [_empty_open() for _ in shares], "; ".join(timeouts)
    dealt = open_loop.deal(offsets, pool.size)
    # Every client must have its share before its first arrival is due: more clients, more to hand out.
    release_at = time.time() + RELEASE_AHEAD_S * (1 + pool.size / 4)
    deadline = release_at + open_loop.DRAIN_FACTOR * duration_s
    futures = [
        pool.submit(
            run_open_share,
            ids[s],
            vectors[s],
            *args,
            i,
            release_at,
            dealt[i],
            deadline,
            in_flight,
            client_index=i,
        )
        for i, s in enumerate(shares)
    ]
    results = [f.result() for f in futures]
    timeouts = [why for _, _, why in results if why]
    return [r for r, _, _ in results], [q for _, q, _ in results], "; ".join(timeouts) or None


def setting_raw_table(database: str, setting: QuerySetting, **columns: Any) -> pa.Table:
    """:func:`raw_query_table` of one query setting's rows (its label, ef, batch size, clients and k)."""
    return raw_query_table(
        database=database,
        setting=setting.label,
        ef=setting.ef,
        batch_size=setting.batch_size,
        clients=setting.clients,
        k=setting.k,
        **columns,
    )


def _write_setting(
    database: str,
    setting: QuerySetting,
    parts: list[dict[str, list]],
    requests: list[dict[str, np.ndarray]],
    stall: str | None,
    out_dir: str,
    probe: QueryIo | None = None,
    open_meta: dict[str, Any] | None = None,
    not_run: str | None = None,
) -> QueryRecord:
    """Write a setting's raw rows (first answer per distinct query) and its requests file; the raw file's
    metadata carries the stall, if any, the window's I/O counter deltas (``probe``) and an open-loop
    setting's schedule (``open_meta``: rate, arrivals, seed, duration, requests scheduled, lag bound), and
    why a setting was not run (``not_run``: its clients could not offer its rate; its files are empty)."""
    columns = {key: list(itertools.chain.from_iterable(p[key] for p in parts)) for key in ROW_KEYS}
    table = setting_raw_table(database, setting, **columns)
    path = Path(out_dir) / "raw" / f"{setting.label.replace(',', '_').replace('=', '')}.parquet"
    keys = (*REQUEST_KEYS, *OPEN_KEYS) if open_meta is not None else REQUEST_KEYS
    joined = {key: np.concatenate([r[key] for r in requests]) for key in keys}
    ranks = [None if r < 0 else int(r) for r in joined["rank"]]
    every = requests_table(
        joined["client"],
        ranks,
        joined["request"],
        joined["queries"],
        joined["t_start"],
        joined["t_end"],
        joined.get("t_intended"),
        joined.get("queued"),
    )
    write_parquet_atomic(every, requests_path(path), row_group_rows=65536)
    # A stalled setting says so in its file (with the setting, for a file without rows).
    meta = None
    if stall or not_run:
        described = json.dumps({"database": database, **setting.model_dump()})
        meta = {"stalled": stall, "query_setting": described} if stall else {}
        meta.update({"not_run": not_run, "query_setting": described} if not_run else {})
    if probe is not None:
        meta = probe.metadata(meta)
    if open_meta is not None:
        meta = {**(meta or {}), OPEN_LOOP_META: json.dumps(open_meta)}
    write_parquet_atomic(table, path, row_group_rows=8192, metadata=meta)
    return QueryRecord(
        setting=setting.label,
        file=str(path),
        stalled=stall,
        distinct_queries=table.num_rows,
        queries_sent=int(joined["queries"].sum()),
        window_s=_window(joined),
    )


def _window(requests: dict[str, np.ndarray]) -> float:
    """First request sent -> last answer (0 without requests)."""
    if not len(requests["t_start"]):
        return 0.0
    return float(requests["t_end"].max() - requests["t_start"].min())


def _measure(
    pool: ClientPool,
    setting: QuerySetting,
    ids: np.ndarray,
    vectors: np.ndarray,
    warmup: int,
    duration_s: float | None = None,
    probe: QueryIo | None = None,
) -> tuple[list[dict[str, list]], list[dict[str, np.ndarray]], str | None]:
    """Run one setting over every client; run it once more if it stalled. Returns (rows, requests, stall).

    Two phases: every client connects and warms up (:func:`warm_share`); once all have, each is handed its
    share with one common ``release_at`` a little ahead, so they start together, and cycles through it
    for ``duration_s`` (None: sends it once).
    """
    stall = None
    shares = np.array_split(np.arange(len(ids)), pool.size)
    args = (setting.k, setting.ef, setting.batch_size)
    for attempt in range(1, ATTEMPTS + 1):
        warm = [
            pool.submit(warm_share, vectors[s[:warmup]], *args, i, client_index=i)
            for i, s in enumerate(shares)
        ]
        timeouts = [why for why in (f.result() for f in warm) if why]
        parts = [empty_rows() for _ in shares]
        requests = [empty_requests() for _ in shares]
        if not timeouts:
            # The measured part only (warm-up excluded): the I/O counters' window.
            with probe.window() if probe is not None else contextlib.nullcontext():
                release_at = time.time() + RELEASE_AHEAD_S
                futures = [
                    pool.submit(
                        run_share, ids[s], vectors[s], *args, 0, i, release_at, duration_s, client_index=i
                    )
                    for i, s in enumerate(shares)
                ]
                results = [f.result() for f in futures]
            parts = [rows for rows, _, _ in results]
            requests = [every for _, every, _ in results]
            timeouts = [why for _, _, why in results if why]
        stall = "; ".join(timeouts) if timeouts else slow_request(requests)
        if stall is None:
            return parts, requests, None
        log.warning(
            "query setting %s stalled (attempt %d of %d): %s", setting.label, attempt, ATTEMPTS, stall
        )
    return parts, requests, f"stalled twice; last: {stall}"
