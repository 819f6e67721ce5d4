"""Open-loop query load: arrivals at an offered rate that do not wait for answers.

A closed loop (the sweep's other settings) sends a client's next request when its last one returns. When
the server stalls, it stops sending: the requests that would have arrived during the stall are never sent,
so they are never late, and its percentiles hide the queueing a real service sees (coordinated omission).

Here the arrival times are fixed before the window starts: Poisson or constant spacing at the offered rate,
seeded (:func:`arrival_offsets`), dealt round-robin to the client processes (:func:`deal`). Each client
process sends each request at its intended time on one of ``in_flight`` threads sharing its connection
(:func:`send_on_schedule`), so a slow answer holds back no later arrival. Each request's latency is
measured from its intended time, as wrk2 does, beside its service time from the actual send.

Two things would make a setting measure the load generator instead of the server, and the report marks
such a setting invalid instead of showing its figures:
- the generator's lag: how late it sent a request that had a free sender (its P99 above ``max_lag_ms``);
- client-bound: more than 1% of the requests found every sender of their client busy and waited for one
  (:data:`QUEUED_SHARE`): the clients, not the server, held them back. Raise ``clients`` or ``in_flight``.

Percentiles come from HdrHistogram (``hdrh``), at microsecond resolution.

Everything here is computed afterwards from the raw requests (``t_intended``, ``t_start``, ``t_end`` per
request), as for the closed loop.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, NamedTuple

import numpy as np
import pyarrow as pa
from hdrh.histogram import HdrHistogram

from apps.vdb.base import RequestTimeout

Arrivals = Literal["poisson", "constant"]

# The histograms: 1 µs to 1 h, 3 significant digits (0.1% of a value).
_HIST_LOW_US, _HIST_HIGH_US, _HIST_DIGITS = 1, 3_600_000_000, 3

# rate: auto. Steps start at this fraction of the closed-loop request rate of the same setting and grow by
# this factor until P99 passes the bound, achieved throughput falls below the offered rate, or the
# generator lags; at most this many steps.
AUTO_START, AUTO_FACTOR, AUTO_MAX_STEPS = 0.25, 1.25, 16
# Then the gap between the last rate served and the first not served is halved this many times: the knee
# to within 25% / 2^3 ≈ 3% of the rate, instead of a 25% step.
AUTO_REFINE = 3
# A rate is kept up when achieved >= this × offered (the knee's second condition).
KEPT_UP = 0.98
# A client's window ends this many window lengths after its start, sent or not: a server far behind its
# offered rate must not hold the stage for the whole backlog (what was not sent is counted as unsent).
DRAIN_FACTOR = 2.0
# A client process keeps at most in_flight requests out. Before the run, a rate is refused when the
# requests it keeps out on average (rate x service time, Little's law) would fill more than this share of
# clients x in_flight senders: queueing needs headroom.
CLIENT_UTILISATION = 0.7
# After the run: a setting where more than this share of requests found every sender of their client busy
# is client-bound (its waits were the clients', charged to the server).
QUEUED_SHARE = 0.01
# validate knows no service time yet: no client of this project answers faster than this (an in-process
# search of a small collection), so a rate above senders x 0.7 / this cannot be offered at all. At run
# time the closed-loop setting's median request takes its place.
MIN_SERVICE_S = 0.0002


def arrival_offsets(rate: float, duration_s: float, arrivals: Arrivals, seed: int) -> np.ndarray:
    """Intended send times, in seconds from the window's start, of every request of a window.

    ``rate``: requests per second over all clients. Constant spacing sends at 0, 1/rate, 2/rate, …;
    Poisson arrivals have exponential gaps of mean 1/rate from a generator seeded with ``seed`` (every rate
    of a sweep scales the same unit-rate draws: common random numbers, so two rates differ by their rate,
    not by their luck).
    """
    if rate <= 0 or duration_s <= 0:
        raise ValueError(f"open loop: rate {rate} and duration {duration_s} must be > 0")
    expected = rate * duration_s
    if arrivals == "constant":
        return np.arange(max(1, math.ceil(expected)), dtype=np.float64) / rate
    # Draw well past the expected count (10 standard deviations): stopping at the expected count would cut
    # every window that should hold more arrivals, and bias the offered rate low.
    draws = math.ceil(expected + 10 * math.sqrt(expected) + 10)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=draws)
    offsets = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    return offsets[offsets < duration_s]


class ClientArrivals:
    """One client's share of an open-ended schedule (the mixed phase runs until its inserts end): gaps
    of a Poisson process of rate / clients (seeded per client; the clients together are Poisson at
    ``rate``), or constant spacing clients / rate starting at index / rate."""

    def __init__(self, rate: float, clients: int, index: int, arrivals: Arrivals, seed: int) -> None:
        self.rate, self.clients, self.index, self.arrivals = rate, clients, index, arrivals
        self.rng = np.random.default_rng([seed, index])
        self.started = False

    def next_gap(self) -> float:
        """Seconds from the previous intended time (from the start, for the first) to the next."""
        first, self.started = not self.started, True
        if self.arrivals == "constant":
            return self.index / self.rate if first else self.clients / self.rate
        return float(self.rng.exponential(self.clients / self.rate))


def schedule_meta(
    rate: float, arrivals: Arrivals, seed: int, duration_s: float, scheduled: int, max_lag_ms: float
) -> dict[str, Any]:
    """What a raw file records of its open-loop schedule (read back by the metrics)."""
    return {
        "rate": rate,
        "arrivals": arrivals,
        "seed": seed,
        "duration_s": duration_s,
        "scheduled": scheduled,
        "max_lag_ms": max_lag_ms,
    }


def deal(offsets: np.ndarray, clients: int) -> list[np.ndarray]:
    """The intended times dealt round-robin to ``clients`` client processes (arrival i to client i % c)."""
    return [offsets[i::clients] for i in range(clients)]


def senders_needed(rate: float, service_s: float) -> int:
    """Senders (clients x in_flight) that can offer ``rate`` requests/s when each takes ``service_s``."""
    return max(1, math.ceil(rate * service_s / CLIENT_UTILISATION))


def too_few_clients(rate: float, senders: int, service_s: float, source: str) -> str | None:
    """Why ``senders`` (client processes x in_flight each) cannot offer ``rate`` at ``service_s`` per
    request (``source`` names the estimate); None when they can."""
    needed = senders_needed(rate, service_s)
    if needed <= senders:
        return None
    return (
        f"rate {rate:g} requests/s needs at least {needed} senders (clients x in_flight) at {source} "
        f"{service_s * 1000:.3g} ms a request (each sender has one request out, busy at most "
        f"{CLIENT_UTILISATION:.0%} of the time); it has {senders}"
    )


class SendLog(NamedTuple):
    """What :func:`send_on_schedule` sent: per request (in intended order) its number, intended, start
    and end time, whether it waited for a sender (``queued``), and its result (those kept); ``sent`` the
    requests handed out; ``error`` the first request timeout (its request is recorded, ending then)."""

    number: np.ndarray
    t_intended: np.ndarray
    t_start: np.ndarray
    t_end: np.ndarray
    queued: np.ndarray
    results: dict[int, Any]
    sent: int
    error: str | None


def send_on_schedule(
    send: Callable[[int], Any],
    intended: Iterable[float],
    in_flight: int,
    deadline: float,
    stop: Callable[[], bool] | None = None,
    keep: int | None = None,
) -> SendLog:
    """Send request i (``send(i)``) at its ``intended`` ``time.time()``, on one of ``in_flight`` threads.

    The calling thread sleeps until each intended time and hands the request to a free sender; when all
    are out, the request waits for one and is marked ``queued``. Sending stops at ``deadline``, when
    ``stop()`` says so (checked before each request), or at the first request timeout. Results are kept
    for requests below ``keep`` (None: all). Returns once every request handed out has its answer; any
    other error of a request is raised here then, as the closed loop would raise it.
    """
    lock = threading.Lock()
    busy = [0]
    rows: list[tuple[int, float, float, float, bool]] = []
    results: dict[int, Any] = {}
    errors: list[str] = []
    failures: list[BaseException] = []  # anything but a timeout: raised here once the senders are done

    def one(number: int, when: float, queued: bool) -> None:
        t0, result = time.time(), None
        try:
            result = send(number)
        except RequestTimeout as exc:
            errors.append(str(exc))
        except BaseException as exc:  # handed to the calling thread, not lost in a future
            failures.append(exc)
            return
        finally:
            with lock:
                busy[0] -= 1
        t1 = time.time()
        with lock:
            rows.append((number, when, t0, t1, queued))
            if result is not None and (keep is None or number < keep):
                results[number] = result

    sent = 0
    with ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="open-loop") as senders:
        for number, when in enumerate(intended):
            if errors or failures or time.time() >= deadline:
                break
            wait = when - time.time()
            if wait > 0:
                time.sleep(wait)
            if stop is not None and stop():
                break
            with lock:
                queued = busy[0] >= in_flight
                busy[0] += 1
            senders.submit(one, number, when, queued)
            sent += 1
    if failures:
        raise failures[0]
    rows.sort()
    columns = list(zip(*rows, strict=True)) if rows else [[]] * 5
    return SendLog(
        np.asarray(columns[0], np.int64),
        *(np.asarray(c, np.float64) for c in columns[1:4]),
        np.asarray(columns[4], bool),
        results,
        sent,
        errors[0] if errors else None,
    )


def _histogram(values_s: np.ndarray) -> HdrHistogram:
    hist = HdrHistogram(_HIST_LOW_US, _HIST_HIGH_US, _HIST_DIGITS)
    for value in np.clip(np.rint(values_s * 1e6), _HIST_LOW_US, _HIST_HIGH_US).astype(np.int64):
        hist.record_value(int(value))
    return hist


def percentiles_ms(values_s: np.ndarray, points: Sequence[float] = (50, 99, 99.9)) -> list[float]:
    """Percentiles of durations (seconds) in milliseconds, from an HdrHistogram (NaN when empty)."""
    if not len(values_s):
        return [math.nan] * len(points)
    hist = _histogram(np.asarray(values_s, np.float64))
    return [hist.get_value_at_percentile(p) / 1000.0 for p in points]


def open_loop_stats(
    requests: pa.Table, rate: float, scheduled: int, duration_s: float, max_lag_ms: float
) -> dict[str, float | int | bool]:
    """The open-loop figures of one setting's window from its requests (with ``t_intended``).

    ``rate``: the configured requests/s; ``scheduled``: the requests its schedule held over
    ``duration_s``. ``offered_rate`` and ``achieved_rate``: intended sends and answers per second, each
    over its own span (so a constant latency does not count against the server; with ``unsent`` requests,
    the schedule's count over ``duration_s``). Latencies in ms: ``intended_p50_ms`` … ``intended_p999_ms``
    from each request's intended time, ``p50_ms``, ``p95_ms``, ``p99_ms``, ``p999_ms`` service time from
    its actual send. ``lag_p99_ms`` (how late a request with a free sender left) and ``lag_ok`` (within
    ``max_lag_ms``); ``queued_share``: requests that waited for a sender of their client.
    """
    if requests.num_rows == 0:
        raise ValueError("open loop: no requests in the window")
    intended = requests.column("t_intended").to_numpy(zero_copy_only=False)
    start = requests.column("t_start").to_numpy()
    end = requests.column("t_end").to_numpy()
    if np.isnan(intended).any():
        raise ValueError("open loop: a request has no intended send time")
    queued = _queued(requests)
    lag = np.where(queued, 0.0, np.maximum(0.0, start - intended))
    lag_p99 = percentiles_ms(lag, (99,))[0]
    n, unsent = len(end), int(scheduled - len(end))
    i50, i99, i999 = percentiles_ms(end - intended)
    # Every service-time percentile of the row from the one histogram: window_stats' interpolated ones
    # (which the row is built on) are replaced, P95 too, not left beside these.
    s50, s95, s99, s999 = percentiles_ms(end - start, (50, 95, 99, 99.9))
    return {
        "rate": float(rate),
        "offered_rate": _per_second(intended) if not unsent else scheduled / duration_s,
        "achieved_rate": _per_second(end) if n > 1 else n / duration_s,
        "unsent": unsent,
        "intended_p50_ms": i50,
        "intended_p99_ms": i99,
        "intended_p999_ms": i999,
        "p50_ms": s50,
        "p95_ms": s95,
        "p99_ms": s99,
        "p999_ms": s999,
        "lag_p99_ms": lag_p99,
        "lag_ok": bool(lag_p99 <= max_lag_ms),
        "queued_share": float(queued.mean()),
    }


def _per_second(times: np.ndarray) -> float:
    """Events per second over their own span ((n - 1) gaps); NaN for fewer than two or no span."""
    span = float(times.max() - times.min()) if len(times) > 1 else 0.0
    return (len(times) - 1) / span if span > 0 else math.nan


def _queued(requests: pa.Table) -> np.ndarray:
    """Per request: did it wait for a sender (``queued``; False for files without the column)."""
    if "queued" not in requests.column_names:
        return np.zeros(requests.num_rows, bool)
    return np.asarray(requests.column("queued").fill_null(False).to_numpy(zero_copy_only=False), bool)


def invalid(stats: dict[str, Any]) -> str | None:
    """Why a setting's figures measure the generator or its clients rather than the server (None: valid)."""
    if stats.get("lag_ok") is False:
        return f"generator lag P99 {stats['lag_p99_ms']:.2f} ms"
    queued = stats.get("queued_share")
    if queued is not None and queued > QUEUED_SHARE:
        return f"client-bound: {queued:.0%} of requests waited for a free sender (raise clients or in_flight)"
    return None


def keeps_up(stats: dict[str, Any], bound_ms: float | None) -> bool:
    """True when a rate is served: a valid setting (:func:`invalid`), nothing left unsent, achieved ≥ 0.98 ×
    offered (the schedule's own rate), and (with a bound) the intended-time P99 is within ``bound_ms``."""
    if invalid(stats) or stats.get("unsent"):
        return False
    if not stats["achieved_rate"] >= KEPT_UP * stats["offered_rate"]:
        return False
    return bound_ms is None or stats["intended_p99_ms"] <= bound_ms
