"""Typed records passed between the vector-database stages, and the one ``setting`` label.

The runner (``pipeline/vdb_stages.py``) validates a :class:`DatabaseTarget` once and hands it to every task;
each task returns a frozen record; the runner assembles them into a :class:`DatabaseOutcome`, which is the
database's ``manifest.json`` (``model_dump_json``) and what the report reads. Every field here is read by
someone (the next stage, the report, or the benchmarks in ``benchmarks/``): a field nobody reads is deleted,
a field the report reads is written by a stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from apps.telemetry.sampler import announce_engine
from apps.vdb.base import CollectionSpec, Endpoints
from apps.vdb.config import DatabaseSettings
from apps.vdb.server_facts import ServerFacts
from apps.vdb.stages.mixed_config import MixedRecord

if TYPE_CHECKING:
    from apps.vdb.base import Client


def setting_label(
    ef: int | None,
    batch_size: int,
    clients: int,
    k: int | None = None,
    *,
    request_size: int | None = None,
    rate: float | None = None,
) -> str:
    """The one ``setting`` string of a measurement (file names, result rows, report tables and figures).

    A query setting (``k`` given): ``ef=64,batch=32,clients=2,k=10`` (``ef=none`` without a search-time
    knob). An insert setting (no ``k``, no ``ef``): ``batch=1024,clients=2``, or
    ``batch=1024,sent=512,clients=2`` when the database took smaller requests than the configured batch.
    An open-loop query setting ends with its offered rate in requests/s: ``...,k=10,rate=500``.
    """
    parts = [] if k is None else [f"ef={'none' if ef is None else int(ef)}"]
    parts.append(f"batch={int(batch_size)}")
    if request_size is not None and request_size != batch_size:
        parts.append(f"sent={int(request_size)}")
    parts.append(f"clients={int(clients)}")
    if k is not None:
        parts.append(f"k={int(k)}")
    if rate is not None:
        parts.append(f"rate={rate:g}")
    return ",".join(parts)


class Record(BaseModel):
    """Base of the records: immutable, unknown fields rejected (a renamed field fails loudly)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseTarget(Record):
    """Everything a stage task needs to reach one database's collection."""

    settings: DatabaseSettings
    endpoints: Endpoints
    collection: CollectionSpec

    @property
    def database(self) -> str:
        """The database's registry name (``qdrant``, ``milvus``, ``weaviate``)."""
        return self.settings.name

    def open_client(self, client_index: int = 0) -> Client:
        """A client in this process on ``endpoints.entry(client_index)``, not attached to the collection."""
        from apps.vdb import database

        if self.endpoints.in_process:  # this process runs the engine: let the telemetry sample it
            announce_engine(self.endpoints.data_dir)
        return database(self.database).client(self.settings, self.endpoints, client_index)


class Deployed(Record):
    """What the deploy task returns: the healthy endpoints and how long the start took."""

    endpoints: Endpoints
    deploy_s: float  # deploy start -> every endpoint healthy
    servers: list[ServerFacts] = Field(default_factory=list)  # local server processes as the kernel saw them


class InsertPart(Record):
    """What one insert client (or one insert task, summed over its clients) sent."""

    rows: int
    first_start: float | None  # time.time() of the first request; None when nothing was sent
    last_end: float
    batches: int  # configured batches sent (each in one or more requests)
    retried: int  # requests that needed a retry
    clients: int
    request_size: int  # vectors per request actually sent: min(batch size, the client's maximum)
    # When every row sent was visible to search, for clients whose inserts are visible on return (an
    # in-process engine: counted after the last request); None: wait_searchable polls the database.
    visible_at: float | None = None


class Searchable(Record):
    """The moment every inserted vector was visible to search."""

    searchable_at: float
    count: int


class InsertRecord(Record):
    """One full upload at one configured batch size (a point of the insert-versus-batch-size curve)."""

    batch_size: int  # configured
    request_size: int  # actually sent per request (smaller when the database caps its request size)
    rows: int
    clients: int
    workers: int
    upload_s: float  # first request -> every vector searchable
    searchable_s: float  # last request acknowledged -> every vector searchable
    insert_vectors_per_s: float

    @property
    def setting(self) -> str:
        return setting_label(None, self.batch_size, self.clients, request_size=self.request_size)


class IndexRecord(Record):
    """The index build and the storage it left."""

    index_s: float
    count: int
    segments: int | None
    disk_bytes: int | None
    write_amplification: float | None  # disk bytes / raw float32 bytes of the vectors
    # The on-disk footprint split by kind, where the database's describe() tells them apart
    # (StorageStats.details["index_bytes"] / ["data_bytes"]); None: not told apart.
    index_bytes: int | None = None
    data_bytes: int | None = None


class QuerySetting(Record):
    """One point of the query sweep."""

    ef: int | None
    batch_size: int
    clients: int
    k: int
    rate: float | None = None  # open loop: offered requests/s (apps/vdb/stages/open_loop.py); None: closed

    @property
    def label(self) -> str:
        return setting_label(self.ef, self.batch_size, self.clients, self.k, rate=self.rate)


class QueryRecord(Record):
    """One query setting's raw results (evaluated later by the report)."""

    setting: str
    file: str
    stalled: str | None = None  # why the setting stalled twice (its figures are not normal ones)
    # What the figures rest on (None: written before timed windows): distinct queries answered (recall),
    # queries sent in the window (every pass), and the window's seconds (first request -> last answer).
    distinct_queries: int | None = None
    queries_sent: int | None = None
    window_s: float | None = None


class DatabaseOutcome(Record):
    """One database's benchmark: its ``manifest.json`` (succeeded) or ``skipped.json``, read by the report."""

    database: str
    status: Literal["succeeded", "skipped"]
    reason: str | None = None  # why it was skipped
    # The sweep point this is (pipeline/sweep.py): its label in the report, repeat, key and swept values.
    label: str | None = None  # None: an outcome written before sweeps (its label is the database)
    repeat: int = 0
    key: str | None = None
    params: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    settings: DatabaseSettings
    collection: CollectionSpec
    server_version: str = ""
    deploy_s: float | None = None  # deploy start -> every endpoint healthy
    servers: list[ServerFacts] = Field(default_factory=list)  # affinity, threads, listeners read back
    insert: list[InsertRecord] = Field(default_factory=list)
    index: IndexRecord | None = None
    queries: list[QueryRecord] = Field(default_factory=list)
    mixed: MixedRecord | None = None  # the mixed insert + query workload (vdb.mixed), when configured
    files: list[dict[str, str | int]] = Field(default_factory=list)  # raw results, for complete_manifest
