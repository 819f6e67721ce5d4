"""Configuration and record of the mixed insert + query workload (``vdb.mixed``; ../shared/papers/000 §V-D).

Kept apart from :mod:`apps.vdb.stages.mixed` (which needs the client pools) so that :mod:`apps.vdb.config` and
:mod:`apps.vdb.records` can name these models without importing any client machinery.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from apps.vdb import runs_in_process
from apps.vdb.stages.open_loop import MIN_SERVICE_S, too_few_clients
from core.config import Strict


class MixedConfig(Strict):
    """The mixed insert + query workload: a phase of each point after the query sweep (None: off).

    A fresh collection is preloaded with the first ``preload_fraction`` of the point's rows (the dataset's,
    or its first ``vdb.insert.rows``; row order) and indexed; the same queries are measured on it alone
    (the baseline); then insert clients send the rest of those rows in order while query clients query,
    until the last insert is acknowledged.
    """

    preload_fraction: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Share of the point's rows (the dataset, or its first vdb.insert.rows; the first ones) "
        "loaded and indexed beforehand.",
    )
    checkpoint_fraction: float = Field(
        0.05,
        gt=0,
        le=1,
        description="Exact ground truth is computed at prefixes every this share of the inserted rows "
        "(plus the preloaded prefix); each query is scored against the last prefix fully acknowledged "
        "before it was sent.",
    )
    insert_clients: int = Field(1, ge=1, description="Insert client processes (batches dealt in turn).")
    insert_batch_size: int = Field(32, ge=1, description="Vectors per insert request.")
    insert_rate: Literal["max"] | float = Field(
        "max",
        description="Vectors per second over all insert clients (each paces its share), or max (no pacing).",
    )
    query_clients: int = Field(1, ge=1, description="Query client processes.")
    in_flight: int = Field(
        8, ge=1, description="Open loop: query requests one client process may have out at once (threads)."
    )
    query_rate: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Open loop: query requests per second over all query clients, in the baseline and the "
        "mixed phase, on a schedule that does not wait for answers; latency then counts from each "
        "request's intended send time (docs/open-loop.md). Sweep it beside insert_rate for 'P99 at R "
        "queries/s while inserting W vectors/s'. None: the query clients send back to back (closed loop).",
    )
    arrivals: Literal["poisson", "constant"] = Field(
        "poisson", description="Open loop: Poisson arrivals (exponential gaps) or constant spacing."
    )
    seed: int = Field(0, description="Open loop: the seed of the Poisson arrival times.")
    max_lag_ms: float = Field(
        1.0,
        gt=0,
        description="Open loop: generator lag P99 above this marks the phase invalid in the report.",
    )
    query_batch_size: int = Field(32, ge=1, description="Queries per request.")
    ef: int | None = Field(64, ge=1, description="Search-time ef (nprobe for IVF); None: the default.")
    k: int = Field(10, ge=1, description="Neighbours per query.")
    max_queries: int | None = Field(None, ge=1, description="Use at most this many queries.")
    warmup_queries: int = Field(16, ge=0, description="Queries sent (unrecorded) before each phase.")
    baseline_duration_s: float = Field(
        10.0, gt=0, description="Seconds the baseline (preloaded collection, no inserts) is measured."
    )
    timeout_s: float = Field(1800, gt=0, description="Upper bound on preloading and on the mixed phase.")

    @field_validator("query_rate")
    @classmethod
    def _offerable(cls, rate: float | None, info: ValidationInfo) -> float | None:
        """A query rate the configured query clients' senders could not offer at all is refused."""
        senders = (info.data.get("query_clients") or 1) * (info.data.get("in_flight") or 1)
        source = "the fastest service time,"
        why = None if rate is None else too_few_clients(rate, senders, MIN_SERVICE_S, source)
        if why:
            raise ValueError(f"{why}; raise vdb.mixed.query_clients or in_flight, or lower the rate")
        return rate


class MixedRecord(BaseModel):
    """What the mixed phase of a point wrote (raw files; metrics come later, in the report stage)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preload_rows: int  # rows [0, preload_rows) loaded and indexed before the phase
    total_rows: int  # the dataset's rows: [preload_rows, total_rows) inserted while querying
    setting: str  # setting_label of the queries (ef, batch, clients, k)
    insert_setting: str  # setting_label of the inserts (batch, clients)
    insert_rate: float | None  # vectors/s asked for (None: max)
    query_rate: float | None = None  # open loop: query requests/s offered (None: closed loop)
    released_at: float | None = None  # time.time() the mixed phase's clients started
    max_lag_ms: float | None = None  # open loop: the generator-lag bound
    queries_unsent: int | None = None  # open loop: arrivals due before the phase ended, never sent
    checkpoint_fraction: float
    preload_s: float  # preload upload + index build
    baseline_file: str  # raw rows (first answer per distinct query) of the baseline
    baseline_requests_file: str  # every request of the baseline window
    queries_file: str  # mixed phase: one row per query sent (ids, send and answer time, client); every
    # request beside it (query_raw.requests_path), with its intended send time in the open loop
    inserts_file: str  # mixed phase: one row per insert batch (rows, send and acknowledge time)
    last_ack: float  # time.time() of the last insert acknowledged


def mixed_problems(mixed: MixedConfig | None, databases: list) -> list[tuple[tuple, str]]:
    """(location, message) for a point that cannot run the mixed workload.

    An in-process engine (Qdrant edge) has one client process, which holds the engine's file lock: the
    separate insert and query client processes the workload measures cannot open it, so it is refused
    here (at validation, before any database starts) rather than measured in a different way.
    """
    if mixed is None:
        return []
    return [
        (
            ("mixed",),
            f"{db.name} runs in process (mode: {getattr(db, 'mode', 'edge')}): the mixed workload needs "
            "separate insert and query client processes; use a server (qdrant mode: server, a url) or "
            "leave this database out of a run with vdb.mixed",
        )
        for db in databases
        if runs_in_process(db)
    ]
