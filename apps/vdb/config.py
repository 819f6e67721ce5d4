"""Configuration of the vector-database stages: the databases, the collection, insert and the query sweep."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from apps.vdb import database, databases, runs_in_process
from apps.vdb.base import CollectionConfig
from apps.vdb.capabilities import collection_problems
from apps.vdb.cluster.config import DatabaseClusterConfig
from apps.vdb.stages.mixed_config import MixedConfig, mixed_problems
from apps.vdb.stages.open_loop import MIN_SERVICE_S, too_few_clients
from apps.vdb.sweep import (
    Expansion,
    SweepError,
    SweepPoint,
    expand,
    restore,
    validate_points,
    written_loc,
)
from core.config import Strict

_POINT = "vdb-sweep-point"  # validation context: a point of a sweep, already expanded
# Every registered database's settings model, discriminated by ``name`` (pydantic only: no client library).
_SETTINGS_MODELS = tuple(db.settings for db in databases())
DatabaseSettings = Annotated[Union[_SETTINGS_MODELS], Field(discriminator="name")]  # noqa: UP007
# One item of a sweep list (k, ef, batch sizes, clients): 0 or a negative would fail mid-run.
Positive = Annotated[int, Field(ge=1)]
PositiveRate = Annotated[float, Field(gt=0, allow_inf_nan=False)]


DEFAULT_MAX_POINTS = 1000  # vdb.max_points: beyond it a sweep is refused unless raised


class InsertConfig(Strict):
    """How vectors are loaded."""

    batch_sizes: list[Positive] = Field(
        [1000],
        min_length=1,
        description="Vectors per insert request; each size is a full upload into a fresh collection (the "
        "throughput-versus-batch-size curve); the last one is kept for indexing and queries.",
    )
    rows: int | None = Field(
        None,
        ge=1,
        description="Load only the first N rows of the dataset, in its row order (a sweepable knob: "
        "`rows: [2000, 8000]`); recall is scored against the exact top-k of those rows. None: every row.",
    )
    workers: int = Field(1, ge=1, description="Parsl tasks the rows are partitioned across.")
    clients_per_worker: int = Field(
        2, ge=1, description="Client processes per task (processes, not asyncio: conversion is CPU-bound)."
    )
    retries: int = Field(
        5, ge=0, description="Retries of a failed batch (idempotent: ids are deterministic)."
    )
    timeout_s: float = Field(900, gt=0, description="Upper bound on upload and on time to searchability.")


class QuerySweepConfig(Strict):
    """The query sweep: every combination is run over the query set."""

    ef: list[Positive] = Field([16, 32, 64, 128], min_length=1, description="Search-time ef (HNSW) values.")
    batch_size: list[Positive] = Field([1, 32], min_length=1, description="Queries per request.")
    clients: list[Positive] = Field([1], min_length=1, description="Concurrent client processes.")
    k: list[Positive] = Field([10], min_length=1, description="Neighbours per query (<= groundtruth.k).")
    max_queries: int | None = Field(None, ge=1, description="Use at most this many queries per setting.")
    warmup_queries: int = Field(16, ge=0, description="Queries sent (and discarded) before each setting.")
    page_cache: Literal["drop", "keep"] = Field(
        "keep",
        description="Before each setting: keep the page cache ('warm'), or drop it (as the storage study "
        "does, so reads hit the disk: 'cold'). Dropping is machine-wide and needs root, so it is opt-in; "
        "a refused drop is recorded as warm with the reason.",
    )
    duration_s: float | None = Field(
        10.0,
        gt=0,
        description="Seconds each setting is measured, each client cycling through its share of the query "
        "set (at least one full pass); QPS and latency rest on every request of that window, recall on "
        "the first answer to each distinct query. None: send the query set once.",
    )
    arrivals: Literal["poisson", "constant"] = Field(
        "poisson", description="Open loop: Poisson arrivals (exponential gaps) or constant spacing."
    )
    seed: int = Field(0, description="Open loop: the seed of the Poisson arrival times.")
    p99_bound_ms: float | None = Field(
        None,
        gt=0,
        description="Open loop: the P99 latency bound (from intended send time, ms) that defines the knee "
        "(the highest rate served within it) and stops rate: auto. Needed with rate: auto.",
    )
    in_flight: int = Field(
        8,
        ge=1,
        description="Open loop: requests one client process may have out at once (threads sharing its "
        "connection), so a slow answer holds back no later arrival; clients x in_flight bound the load "
        "offered. A setting where more than 1% of requests waited for a free one is client-bound (invalid). "
        "An in-process engine uses 1.",
    )
    max_lag_ms: float = Field(
        1.0,
        gt=0,
        description="Open loop: a setting whose generator lag P99 (how late a free client sent) exceeds "
        "this is marked invalid instead of reported: the generator, not the server, set its pace.",
    )

    rate: list[PositiveRate] | Literal["auto"] | None = Field(
        None,
        description="Open loop: offered request rates (requests/s over all clients), each a setting of its "
        "own after the closed-loop setting of the same ef, batch, clients and k. Arrivals do not wait for "
        "answers; latency is measured from each request's intended send time (docs/open-loop.md). 'auto' "
        "steps up from a quarter of that setting's closed-loop rate by 1.25x until the P99 passes "
        "p99_bound_ms or achieved throughput falls below 0.98x the offered rate, then halves the last "
        "step three times to place the knee. None: closed loop only.",
    )

    @field_validator("rate")
    @classmethod
    def _open_loop_needs(cls, rate: Any, info: ValidationInfo) -> Any:
        """rate: auto needs its bound; a rate no number of the configured clients could offer is refused."""
        if rate == "auto" and info.data.get("p99_bound_ms") is None:
            raise ValueError("rate: auto needs vdb.query.p99_bound_ms (the P99 bound where the steps stop)")
        in_flight = info.data.get("in_flight") or 1
        for value in rate if isinstance(rate, list) else []:
            for clients in sorted(set(info.data.get("clients") or [])):
                why = too_few_clients(value, clients * in_flight, MIN_SERVICE_S, "the fastest service time,")
                if why:
                    raise ValueError(f"{why}; raise vdb.query.clients or in_flight, or lower the rate")
        return rate


class VdbConfig(Strict):
    """Vector-database stages: deploy, insert, index, query sweep, teardown, report."""

    databases: list[DatabaseSettings] = Field(min_length=1, description="Databases to benchmark, in order.")
    optional: list[str] = Field(
        default_factory=list,
        description="Databases skipped with a note (instead of failing the run) when they cannot start.",
    )
    collection: CollectionConfig = Field(default_factory=CollectionConfig)
    insert: InsertConfig = Field(default_factory=InsertConfig)
    query: QuerySweepConfig = Field(default_factory=QuerySweepConfig)
    mixed: MixedConfig | None = Field(
        None,
        description="The mixed insert + query workload after the query sweep (apps/vdb/stages/mixed.py); "
        "None: off.",
    )
    cores_per_worker: int | None = Field(
        None,
        ge=1,
        description="Servers started on this machine: cores per server (each database's thread knobs: "
        "GOMAXPROCS, Qdrant's search and indexing threads), pinned to CPUs 0..n-1 with bind: cores. None: "
        "neither. On HPC vdb.cluster.cores_per_worker does this per rank.",
    )
    bind: Literal["cores", "none"] = Field(
        "cores",
        description="cores: pin local servers to their cores_per_worker CPUs (sched_setaffinity); none: set "
        "the thread knobs only, no affinity (the study's unbound runs). Same meaning as vdb.cluster.bind.",
    )
    startup_timeout_s: float = Field(180, gt=0, description="Time a deployment has to become healthy.")
    index_timeout_s: float = Field(1800, gt=0, description="Time the index build has to reach steady state.")
    cluster: DatabaseClusterConfig | None = Field(
        None,
        description="HPC: run each database as a pilot job of Apptainer servers on its own nodes; "
        "None: start it locally (or attach to the url in its settings).",
    )

    sweep: Literal["cartesian", "zip"] = Field(
        "cartesian",
        description="How lists written where one value is expected combine into points: cartesian "
        "(every combination) or zip (the i-th values together; equal lengths).",
    )
    repeats: int = Field(1, ge=1, description="Times every point is measured (each its own deployment).")
    resource_check: Literal["refuse", "warn"] = Field(
        "refuse",
        description="A point whose estimated memory or data exceeds a node's (the resource plan, `plan`) is "
        "refused; warn: say so and run it anyway.",
    )
    max_points: int = Field(
        DEFAULT_MAX_POINTS,
        ge=1,
        description="A sweep expanding to more points (entries x swept values x repeats) is refused: each "
        "point deploys, loads, indexes and queries its database, so a mistyped list can ask for weeks. "
        "Raise it to run a larger sweep on purpose.",
    )
    _expansion: Expansion | None = PrivateAttr(None)
    _points: list[SweepPoint] = PrivateAttr(default_factory=list)

    def index_type_problems(self, entry: int) -> list[tuple[tuple, str]]:
        """(location, message) for a database that does not build the collection's index type, its
        quantisation or on-disk storage (apps/vdb/capabilities.py)."""
        problems = []
        for db in self.databases:
            supported = database(db.name).index_types
            if self.collection.index_type not in supported:
                problems.append(
                    (
                        ("collection", "index_type"),
                        f"{self.collection.index_type!r} is not built by vdb.databases[{entry}] "
                        f"({db.name}); it builds: {', '.join(supported)}",
                    )
                )
                continue
            # Quantisation, on_disk and server-dependent limits (apps/vdb/capabilities.py).
            for message in collection_problems(db, entry, self.collection, self.cluster):
                problems.append((("collection",), message))
        return problems

    @model_validator(mode="wrap")
    @classmethod
    def _expand_sweep(cls, data: Any, handler: Any, info: ValidationInfo) -> VdbConfig:
        """Lists where one value is expected -> points (apps/vdb/sweep.py); the model: first values."""
        if not isinstance(data, dict) or (info.context or {}).get(_POINT):
            return handler(data)
        try:
            expansion = expand(data, cls, list(_SETTINGS_MODELS))
        except SweepError as exc:
            raise ValidationError.from_exception_data(
                cls.__name__, [exc.details(_value_at(data, exc.loc))]
            ) from None
        limit = expansion.base.get("max_points", DEFAULT_MAX_POINTS)
        if isinstance(limit, int) and len(expansion.points) > limit:  # before validating each point
            raise ValueError(
                f"the sweep expands to {len(expansion.points):,} points, more than vdb.max_points {limit:,}: "
                "each one deploys, loads, indexes and queries a database; raise vdb.max_points to run it"
            )
        model = handler(expansion.base)
        model._expansion = expansion
        # Each point is a model of its own: under VdbConfig(...) ``handler`` fills this very instance, so
        # validating the points with it would leave every point (and the section) holding the last one.
        model._points = validate_points(
            expansion,
            lambda raw: cls.model_validate(raw, context={_POINT: True}),
            lambda point, entry: (
                point.index_type_problems(entry) + mixed_problems(point.mixed, point.databases)
            ),
        )
        return model

    @model_serializer(mode="wrap")
    def _written_back(self, handler: Any) -> dict[str, Any]:
        """The dump as written: the swept lists, labels and per-database overrides in place."""
        data = handler(self)
        if self._expansion is None or not self._sweeps:
            return data
        return restore(data, self._expansion)

    @property
    def _sweeps(self) -> bool:
        return bool(self._expansion and (self._expansion.axes or any(self._expansion.entry_keys.values())))

    @property
    def swept(self) -> bool:
        """True when the section sweeps something or repeats (its points are not just its databases)."""
        return self._sweeps or self.repeats > 1

    def written_loc(self, point: SweepPoint, loc: tuple) -> tuple:
        """A location inside ``point.config`` (e.g. ("cluster", "workers")) -> where it was written, with
        the index of the point's value when that field is a list."""
        if self._expansion is None:
            return loc
        raw = {"databases": [{"name": point.database}]}
        return written_loc(loc, point.entry, raw, self._expansion, point.taken)

    @property
    def points(self) -> list[SweepPoint]:
        """Every point in run order: database entries x swept values x repeats."""
        return list(self._points)

    def pilot_databases(self) -> list[DatabaseSettings]:
        """Databases that run as pilot jobs under ``cluster`` (first entry per name). In-process engines
        (Qdrant edge) have no server: they run inside their clients, on the client block."""
        seen: dict[str, DatabaseSettings] = {}
        for db in self.databases:
            if not runs_in_process(db):
                seen.setdefault(db.name, db)
        return list(seen.values())


def _value_at(data: Any, loc: tuple[Any, ...]) -> Any:
    """What the user wrote at ``loc`` of the raw section (a mapping where nothing is there: errors then
    show no value)."""
    for key in loc:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return {}
    return data
