"""The query stage's clients start together: all connect and warm up, then one instant releases them."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import apps.vdb.stages.query_sweep as qs
from apps.vdb import pool as pool_module
from apps.vdb.base import RequestTimeout, SearchResult
from apps.vdb.records import QuerySetting


class FakeClient:
    """Answers every query with ids derived from the query; logs each request and when it was sent."""

    rank = 3

    def __init__(self, log: list[tuple[str, int, float]], name: str, fail_at: int | None = None) -> None:
        self.log, self.name, self.fail_at = log, name, fail_at

    def search(self, queries: np.ndarray, k: int, ef: int | None) -> SearchResult:
        if self.fail_at is not None and len(self.log) >= self.fail_at:
            raise RequestTimeout("no answer within 1 s")
        self.log.append((self.name, len(queries), time.time()))
        first = queries[:, 0].astype(np.int64)
        ids = first[:, None] * 100 + np.arange(k)
        return SearchResult(ids=ids, scores=np.zeros((len(queries), k), np.float32))


@pytest.fixture
def fake_client(monkeypatch) -> list[tuple[str, int, float]]:
    log: list[tuple[str, int, float]] = []
    monkeypatch.setattr(pool_module, "_CLIENT", FakeClient(log, "c"))
    return log


def test_run_share_warms_up_then_waits_for_the_release(fake_client) -> None:
    vectors = np.arange(10, dtype=np.float32)[:, None].repeat(4, axis=1)
    release_at = time.time() + 0.3
    rows, requests, stall = qs.run_share(np.arange(100, 110), vectors, 2, None, 3, 4, 1, release_at)
    assert stall is None
    # warm-up: the first 4 queries in batches of 3 (3 + 1), unrecorded and before the release
    assert [n for _, n, _ in fake_client[:2]] == [3, 1]
    assert all(t < release_at for _, _, t in fake_client[:2])
    # measured: every query, in batches of 3, none sent before the common start
    assert [n for _, n, _ in fake_client[2:]] == [3, 3, 3, 1]
    assert min(rows["t_start"]) >= release_at
    assert rows["query_ids"] == list(range(100, 110))
    assert rows["ids"][7] == [700, 701] and rows["request"] == [0] * 3 + [1] * 3 + [2] * 3 + [3]
    assert rows["client"] == [1] * 10 and rows["rank"] == [3] * 10
    assert requests["queries"].tolist() == [3, 3, 3, 1] and requests["rank"].tolist() == [3] * 4


def test_a_timeout_keeps_the_rows_answered_before_it(monkeypatch) -> None:
    log: list[tuple[str, int, float]] = []
    monkeypatch.setattr(pool_module, "_CLIENT", FakeClient(log, "c", fail_at=2))
    vectors = np.arange(6, dtype=np.float32)[:, None].repeat(4, axis=1)
    rows, requests, stall = qs.run_share(np.arange(6), vectors, 2, None, 2, 0, 0)
    assert stall == "client 0: no answer within 1 s"
    assert rows["query_ids"] == [0, 1, 2, 3] and len(rows["ids"]) == 4
    assert requests["request"].tolist() == [0, 1]
    assert pool_module._CLIENT is None  # dropped: a late answer cannot leak into the next attempt


class RecordingPool:
    """Stands in for ClientPool: logs which pool function ran for which client and when. One thread runs
    every task in turn (the fake client is the pool module's one global), so a client's task may start
    after the common instant, never before."""

    def __init__(self, size: int, fail_at: int | None = None) -> None:
        self.size, self.fail_at = size, fail_at
        self.calls: list[tuple[str, int, Any]] = []
        self.log: list[tuple[str, int, float]] = []
        self.thread = ThreadPoolExecutor(1)

    def submit(self, fn, *args: Any, client_index: int) -> Future:
        self.calls.append((fn.__name__, client_index, args[-2] if fn is qs.run_share else None))

        def run() -> Any:
            pool_module._CLIENT = FakeClient(self.log, f"client{client_index}", self.fail_at)
            return fn(*args)

        return self.thread.submit(run)


def test_measure_releases_every_client_at_one_instant_after_all_warmed_up(monkeypatch) -> None:
    monkeypatch.setattr(pool_module, "_CLIENT", None)
    pool = RecordingPool(2)
    ids = np.arange(8)
    vectors = ids.astype(np.float32)[:, None].repeat(4, axis=1)
    setting = QuerySetting(ef=None, batch_size=1, clients=2, k=2)
    parts, _, stall = qs._measure(pool, setting, ids, vectors, warmup=2)  # type: ignore[arg-type]
    assert stall is None
    names = [name for name, _, _ in pool.calls]
    assert names == ["warm_share", "warm_share", "run_share", "run_share"]  # all warmed before any runs
    releases = {release for name, _, release in pool.calls if name == "run_share"}
    assert len(releases) == 1  # one common start for every client
    [release_at] = releases
    warm_ends = [t for _, _, t in pool.log[:4]]
    assert max(warm_ends) < release_at
    assert all(min(p["t_start"]) >= release_at for p in parts)
    assert [p["query_ids"] for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert sum(1 for name, _, _ in pool.log if name == "client0") == 2 + 4  # warm-up, then its share


def test_a_warm_up_timeout_skips_the_run_and_counts_as_a_stall(monkeypatch) -> None:
    monkeypatch.setattr(pool_module, "_CLIENT", None)
    pool = RecordingPool(1, fail_at=0)  # the client times out on its first request
    setting = QuerySetting(ef=None, batch_size=1, clients=1, k=2)
    ids = np.arange(4)
    parts, _, stall = qs._measure(pool, setting, ids, ids.astype(np.float32)[:, None], warmup=1)  # type: ignore[arg-type]
    assert stall is not None and stall.startswith("stalled twice")
    assert [name for name, _, _ in pool.calls] == ["warm_share", "warm_share"]  # never released
    assert parts == [qs.empty_rows()]


def test_a_timed_share_cycles_through_its_queries_and_keeps_the_first_answers(fake_client) -> None:
    """duration_s: the share is sent over and over until the window has lasted duration_s; the rows keep the
    first answer to each query once, the requests every request of the window."""
    vectors = np.arange(5, dtype=np.float32)[:, None].repeat(4, axis=1)
    rows, requests, stall = qs.run_share(np.arange(10, 15), vectors, 2, None, 2, 0, 0, None, 0.05)
    assert stall is None
    assert rows["query_ids"] == [10, 11, 12, 13, 14]  # each distinct query once
    n = len(requests["t_start"])
    assert n > 3 and len(fake_client) == n  # more than one pass of 3 requests (2 + 2 + 1)
    assert requests["queries"].tolist() == ([2, 2, 1] * n)[:n]
    # Compared as the loop compares (start + duration): a difference of the two could round below 0.05.
    deadline = requests["t_start"][0] + 0.05
    assert requests["t_end"][-1] >= deadline
    assert requests["t_end"][-2] < deadline  # the last request is the one past it
    assert rows["t_start"] == np.repeat(requests["t_start"][:3], [2, 2, 1]).tolist()
