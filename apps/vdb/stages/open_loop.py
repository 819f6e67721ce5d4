"""Open-loop query load: arrivals at an offered rate that do not wait for answers.

A closed loop (the sweep's other settings) sends a client's next request when its last one returns. When
the server stalls, it stops sending: the requests that would have arrived during the stall are never sent,
so they are never late, and its percentiles hide the queueing a real service sees (coordinated omission).

Here the arrival times are fixed before the window starts: Poisson or constant spacing at the offered rate,
seeded (:func:`arrival_offsets`), dealt round-robin to the client processes (:func:`deal`). Each client
sends a request at its intended time, or at once when its previous request is still out
(:func:`apps.vdb.stages.query_sweep.run_open_share`). Each request's latency is measured from its intended
time, as wrk2 does, beside its service time from the actual send.

The generator measures its own lag: how late it sent a request it was free to send (at its intended time,
or when its client's previous answer came back, whichever is later). A setting whose lag P99 exceeds the
configured bound is invalid: the generator, not the server, set its pace, and the report says so instead
of showing its figures. Percentiles come from HdrHistogram (``hdrh``), at microsecond resolution.

Everything here is computed afterwards from the raw requests (``t_intended``, ``t_start``, ``t_end`` per
request), as for the closed loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from hdrh.histogram import HdrHistogram

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
# Each client sends one request at a time, so a busy client delays its next arrival, and that delay would
# be charged to the server. A client may be busy at most this share of the window: before the run, a rate
# is refused when clients x this / (fastest service time) cannot cover it; after it, a setting whose
# busiest client exceeded it is client-bound, not a measurement of the server.
CLIENT_UTILISATION = 0.7
# validate knows no service time yet: no client of this project answers faster than this (an in-process
# search of a small collection), so a rate above clients x 0.7 / this cannot be offered at all. At run
# time the closed-loop setting's fastest request takes its place.
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


def clients_needed(rate: float, service_s: float) -> int:
    """Clients that can offer ``rate`` requests/s when each request takes ``service_s`` to answer."""
    return max(1, math.ceil(rate * service_s / CLIENT_UTILISATION))


def too_few_clients(rate: float, clients: int, service_s: float, source: str) -> str | None:
    """Why ``clients`` cannot offer ``rate`` at ``service_s`` per request (``source`` names the estimate)."""
    needed = clients_needed(rate, service_s)
    if needed <= clients:
        return None
    return (
        f"rate {rate:g} requests/s needs at least {needed} clients at {source} "
        f"{service_s * 1000:.3g} ms a request (each client sends one request at a time, busy at most "
        f"{CLIENT_UTILISATION:.0%} busy); it has {clients}"
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


def generator_lag(
    client: np.ndarray, t_intended: np.ndarray, t_start: np.ndarray, t_end: np.ndarray
) -> np.ndarray:
    """Per request, seconds between when its client was free to send it and when it did.

    Free to send: at its intended time, or when the client's previous answer came back if that was later
    (a request the server kept waiting is the server's delay, measured in the latency, not the
    generator's). Requests are taken in their intended order within each client.
    """
    lag = np.zeros(len(t_start))
    for c in np.unique(client):
        rows = np.flatnonzero(client == c)
        rows = rows[np.argsort(t_intended[rows], kind="stable")]
        free = t_intended[rows].copy()
        free[1:] = np.maximum(free[1:], t_end[rows[:-1]])
        lag[rows] = np.maximum(0.0, t_start[rows] - free)
    return lag


def open_loop_stats(
    requests: pa.Table, rate: float, scheduled: int, duration_s: float, max_lag_ms: float
) -> dict[str, float | int | bool]:
    """The open-loop figures of one setting's window from its requests (with ``t_intended``).

    ``rate``: the configured requests/s; ``scheduled``: the requests its schedule held over
    ``duration_s`` (``offered_rate`` = scheduled / duration_s: a Poisson schedule's realised rate; those
    never sent are ``unsent``). ``achieved_rate``: answers per second over the window (its start to the
    last answer, at least ``duration_s``). Latencies in ms: ``intended_p50_ms`` … ``intended_p999_ms``
    from each request's intended time, ``p50_ms``, ``p99_ms``, ``p999_ms`` service time from its actual
    send; ``lag_p99_ms`` and ``lag_ok`` (lag P99 within ``max_lag_ms``); ``client_busy``: the busiest
    client's share of the window spent waiting for answers (above 0.7 the setting is client-bound).
    """
    if requests.num_rows == 0:
        raise ValueError("open loop: no requests in the window")
    intended = requests.column("t_intended").to_numpy(zero_copy_only=False)
    start = requests.column("t_start").to_numpy()
    end = requests.column("t_end").to_numpy()
    client = requests.column("client").to_numpy()
    if np.isnan(intended).any():
        raise ValueError("open loop: a request has no intended send time")
    lag_p99 = percentiles_ms(generator_lag(client, intended, start, end), (99,))[0]
    window = max(duration_s, float(end.max() - intended.min()))
    busy = max(float((end - start)[client == c].sum()) / window for c in np.unique(client))
    i50, i99, i999 = percentiles_ms(end - intended)
    s50, s99, s999 = percentiles_ms(end - start)
    return {
        "rate": float(rate),
        "offered_rate": scheduled / duration_s,
        "achieved_rate": len(end) / window,
        "unsent": int(scheduled - len(end)),
        "intended_p50_ms": i50,
        "intended_p99_ms": i99,
        "intended_p999_ms": i999,
        "p50_ms": s50,
        "p99_ms": s99,
        "p999_ms": s999,
        "lag_p99_ms": lag_p99,
        "lag_ok": bool(lag_p99 <= max_lag_ms),
        "client_busy": busy,
    }


def invalid(stats: dict[str, Any]) -> str | None:
    """Why a setting's figures measure the generator or its clients rather than the server (None: valid)."""
    if stats.get("lag_ok") is False:
        return f"generator lag P99 {stats['lag_p99_ms']:.2f} ms"
    busy = stats.get("client_busy")
    if busy is not None and busy > CLIENT_UTILISATION:
        return f"client-bound: a client was busy {busy:.0%} of the window (raise clients)"
    return None


def keeps_up(stats: dict[str, Any], bound_ms: float | None) -> bool:
    """True when a rate is served: a valid setting (:func:`invalid`), nothing left unsent, achieved ≥ 0.98 ×
    offered (the schedule's own rate), and (with a bound) the intended-time P99 is within ``bound_ms``."""
    if invalid(stats) or stats.get("unsent"):
        return False
    if not stats["achieved_rate"] >= KEPT_UP * stats["offered_rate"]:
        return False
    return bound_ms is None or stats["intended_p99_ms"] <= bound_ms
