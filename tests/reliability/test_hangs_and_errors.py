"""Hangs and silent bad numbers: frozen servers, errors crossing process boundaries, read-only shards.

* A server frozen (SIGSTOP) during the query stage: the stage is bounded by the request timeout, the
  setting is retried, then flagged as stalled, and the report marks it.
* Every project error round-trips through pickle and a process pool; a client-library error raised in a
  pool process arrives as DatabaseError with its message (no BrokenProcessPool); Parsl's exception wrapper
  pickles a DatabaseError made from a gRPC error that is its own cause.
* A Weaviate shard left READONLY before a setting is set back to READY.

Servers start on 127.0.0.1 with free ports; every frozen process gets SIGCONT and every server is stopped in
``finally`` blocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apps.dataset.layout import vectors_to_arrow
from apps.evaluate.metrics import evaluate_files
from apps.evaluate.rules import best_operating_point
from apps.report.document import write_report
from apps.vdb.base import (
    Client,
    CollectionSpec,
    DatabaseError,
    Endpoints,
    RequestTimeout,
    SearchResult,
    StorageStats,
)
from apps.vdb.config import QuerySweepConfig
from apps.vdb.pool import ClientPool
from apps.vdb.qdrant.settings import QdrantSettings
from apps.vdb.records import DatabaseTarget
from apps.vdb.stages.query_sweep import query_sweep, slow_request
from core.errors import ArtifactError, ConfigError, InputDataError, PipelineError
from core.store import write_parquet_atomic

DIM, ROWS, QUERIES = 16, 600, 60
SPEC = CollectionSpec(name="stall", dim=DIM, metric="l2")


def all_error_types() -> list[type[PipelineError]]:
    """PipelineError and every subclass (those defined by other modules too, once imported)."""
    found, todo = [], [PipelineError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def make_error(cls: type[PipelineError]) -> PipelineError:
    if cls is ConfigError:
        return ConfigError("bad value", file="run.yaml", line=7)
    return cls(f"{cls.__name__}: something went wrong")


def raise_error(name: str) -> None:
    """Pool function: raise the project error named ``name``."""
    cls = next(c for c in all_error_types() if c.__name__ == name)
    raise make_error(cls)


def raise_client_library_error() -> None:
    """Pool function: raise weaviate's UnexpectedStatusCodeError (it cannot be unpickled)."""
    import httpx
    from weaviate.exceptions import UnexpectedStatusCodeError

    response = httpx.Response(
        422,
        json={"error": [{"message": "store is read-only due to: UpdateVectorIndexConfigs"}]},
        request=httpx.Request("PUT", "http://127.0.0.1/v1/schema/C"),
    )
    raise UnexpectedStatusCodeError("Collection configuration could not be updated.", response)


# ---------------------------------------------------------------------------------------------------------
# Errors crossing process boundaries
# ---------------------------------------------------------------------------------------------------------


def test_every_error_type_round_trips_through_pickle() -> None:
    types = all_error_types()
    assert {ConfigError, InputDataError, ArtifactError, DatabaseError, RequestTimeout} <= set(types)
    for cls in types:
        error = make_error(cls)
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is cls and str(back) == str(error) and back.exit_code == error.exit_code
        assert back.__dict__ == error.__dict__


def test_every_error_type_crosses_a_process_pool() -> None:
    with ProcessPoolExecutor(1) as pool:
        for cls in all_error_types():
            with pytest.raises(cls) as caught:
                pool.submit(raise_error, cls.__name__).result()
            assert type(caught.value) is cls and str(caught.value) == str(make_error(cls))


def test_client_library_error_in_a_pool_process_arrives_as_database_error() -> None:
    endpoints = Endpoints(database="qdrant", nodes=[], data_dir="")
    target = DatabaseTarget(settings=QdrantSettings(mode="server"), endpoints=endpoints, collection=SPEC)
    with ClientPool(1, target) as pool:
        with pytest.raises(DatabaseError, match=r"UnexpectedStatusCodeError.*could not be updated"):
            pool.submit(raise_client_library_error).result()
        # The pool survived (no BrokenProcessPool): it still runs work.
        with pytest.raises(ConfigError, match=r"run.yaml:7: bad value"):
            pool.submit(raise_error, "ConfigError").result()


class _FailingClient(Client):
    """A client whose every request raises what a client library raises."""

    def __init__(self) -> None:
        self.request_timeout = 2.0

    def create_collection(self, spec: CollectionSpec, *, recreate: bool = False) -> None:
        raise_client_library_error()

    def insert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        raise ConnectionResetError("connection reset by peer")

    def wait_searchable(self, expected: int, timeout: float) -> None:
        raise DatabaseError("not searchable")

    def build_index(self, timeout: float) -> None:
        raise TimeoutError("deadline exceeded")

    def search(self, queries: np.ndarray, k: int, ef: int | None) -> SearchResult:
        raise ValueError("k must be positive")

    def count(self) -> int:
        return 0

    def describe(self) -> StorageStats:
        return StorageStats(count=0)


def test_client_methods_raise_only_picklable_project_errors() -> None:
    from tblib import pickling_support

    # What importing parsl.app.python does in every Parsl worker: each exception class is then pickled
    # with its __context__ and __cause__, so the client library's error must be on neither chain.
    pickling_support.install()
    db = _FailingClient()
    with pytest.raises(DatabaseError, match=r"create_collection failed.*UnexpectedStatusCodeError") as caught:
        db.create_collection(SPEC)
    assert str(pickle.loads(pickle.dumps(caught.value))) == str(caught.value)
    with pytest.raises(DatabaseError, match=r"ConnectionResetError: connection reset by peer"):
        db.insert(np.zeros(1), np.zeros((1, DIM)))
    with pytest.raises(RequestTimeout, match=r"deadline exceeded"):
        db.build_index(1)
    with pytest.raises(DatabaseError, match=r"^not searchable$"):  # our own errors pass unchanged
        db.wait_searchable(1, 1)
    with pytest.raises(ValueError, match=r"k must be positive"):  # argument errors stay what they are
        db.search(np.zeros((1, DIM)), 0, None)


class _SelfCaused(Exception):
    """Like grpc's _InactiveRpcError under pymilvus: an error that is its own ``__cause__``."""


def _self_caused() -> _SelfCaused:
    inner = _SelfCaused("UNAVAILABLE")
    inner.__cause__ = inner
    return inner


class _MilvusLikeClient(_FailingClient):
    def count(self) -> int:
        try:
            raise _self_caused()
        except _SelfCaused as exc:
            raise DatabaseError(f"milvus: count failed: {exc}") from exc  # what the clients used to do


def _parsl_round_trip(call) -> BaseException:
    """Run ``call`` as a Parsl task body does and pickle the wrapped exception (the Parsl boundary)."""
    from parsl.app.errors import RemoteExceptionWrapper
    from tblib import pickling_support

    pickling_support.install()  # as a Parsl worker does: causes and contexts are pickled too

    try:
        call()
    except Exception:
        wrapped = RemoteExceptionWrapper(*sys.exc_info())
    return pickle.loads(pickle.dumps(wrapped)).get_exception()


def test_parsl_pickles_a_database_error_made_from_a_self_caused_grpc_error() -> None:
    """The 'WorkerLost' case: a gRPC error that is its own cause made Parsl recurse (RecursionError)."""
    back = _parsl_round_trip(_MilvusLikeClient().count)
    assert isinstance(back, DatabaseError) and str(back) == "milvus: count failed: UNAVAILABLE"


def test_milvus_errors_carry_no_cause_chain() -> None:
    from pymilvus import MilvusException

    from apps.vdb.milvus.client import _errors

    def fail() -> None:
        with _errors("search of 10 queries"):
            raise MilvusException(code=2, message="server unavailable") from _self_caused()

    back = _parsl_round_trip(fail)
    assert isinstance(back, DatabaseError) and "milvus: search of 10 queries failed" in str(back)


# ---------------------------------------------------------------------------------------------------------
# Stalls: detection and the report
# ---------------------------------------------------------------------------------------------------------


def test_a_request_far_slower_than_the_median_is_a_stall() -> None:
    def part(latencies: list[float]) -> dict[str, list]:
        starts = list(range(len(latencies)))
        ends = [s + x for s, x in zip(starts, latencies, strict=True)]
        n = len(latencies)
        return {"client": [0] * n, "request": list(range(n)), "t_start": starts, "t_end": ends}

    assert slow_request([part([0.01] * 9 + [0.5])]) is None  # slow but under 1 s
    assert slow_request([part([0.5] * 9 + [2.0])]) is None  # over 1 s but only 4× the median
    assert "8.0s" in slow_request([part([0.01] * 9 + [8.0])])


def _stalled_rows() -> list[dict]:
    common = {"database": "weaviate", "stage": "query", "batch_size": 10, "clients": 1, "k": 10}
    normal = {**common, "setting": "ef=16,batch=10,clients=1,k=10", "ef": 16, "qps": 775.0, "recall": 0.97}
    frozen = {**common, "setting": "ef=64,batch=10,clients=1,k=10", "ef": 64, "qps": 8.0, "recall": 0.99}
    frozen.update(stalled=True, error="stalled: stalled twice; last: client 0: weaviate: search timed out")
    return [{**normal, "status": "ok"}, {**frozen, "status": "ok"}]


def test_report_marks_a_stalled_setting_and_never_picks_it(tmp_path: Path) -> None:
    rows = _stalled_rows()
    assert best_operating_point(rows)["setting"] == "ef=16,batch=10,clients=1,k=10"
    text = write_report(rows, tmp_path)["report"].read_text()
    assert "> **Warning:** weaviate ef=64,batch=10,clients=1,k=10 stalled" in text
    assert "| best | stalled |" in text
    stalled_line = next(line for line in text.splitlines() if line.startswith("| weaviate | ef=64"))
    assert stalled_line.endswith("| **stalled** |")
    summary = text.split("## Summary")[1].split("##")[0]
    assert "ef=16" in summary and "ef=64" not in summary


def test_a_stalled_setting_without_answers_is_a_failed_row(tmp_path: Path) -> None:
    """A raw file flagged stalled with no answered query still gives a (failed, stalled) result row."""
    from apps.vdb.stages.query_raw import RAW_QUERY_SCHEMA

    setting = {"database": "milvus", "ef": 32, "batch_size": 10, "clients": 2, "k": 10}
    path = tmp_path / "raw.parquet"
    meta = {"stalled": "stalled twice", "query_setting": json.dumps(setting)}
    write_parquet_atomic(RAW_QUERY_SCHEMA.empty_table(), path, metadata=meta)
    rows = evaluate_files([path], tmp_path / "gt", tmp_path / "q", tmp_path / "ds", "l2")
    assert rows == [
        {
            "database": "milvus",
            "stage": "query",
            "setting": "ef=32,batch=10,clients=2,k=10",
            "ef": 32,
            "batch_size": 10,
            "clients": 2,
            "k": 10,
            "status": "failed",
            "stalled": True,
            "error": "stalled: stalled twice",
        }
    ]


# ---------------------------------------------------------------------------------------------------------
# Real servers: Weaviate frozen with SIGSTOP, a READONLY shard
# ---------------------------------------------------------------------------------------------------------


def write_queries(path: Path, rng: np.random.Generator) -> Path:
    """A query set of QUERIES random vectors (the query stage's input layout)."""
    vectors = rng.random((QUERIES, DIM), dtype=np.float32)
    table = pa.table(
        {"id": np.arange(QUERIES), "text": [""] * QUERIES, "embedding": vectors_to_arrow(vectors, "float32")}
    )
    write_parquet_atomic(table, path)
    return path


@pytest.fixture
def weaviate(tmp_path: Path):
    """A one-node Weaviate on 127.0.0.1 with a 2 s request timeout, loaded with ROWS vectors."""
    from apps.vdb.weaviate.client import WeaviateClient
    from apps.vdb.weaviate.deploy import WeaviateDeployment
    from apps.vdb.weaviate.settings import WeaviateSettings

    settings = WeaviateSettings(request_timeout=2.0, search_threads=2)
    deployment = WeaviateDeployment(settings)
    try:
        endpoints = deployment.start(tmp_path / "weaviate", timeout=90)
        rng = np.random.default_rng(7)
        db = WeaviateClient(settings, endpoints)
        try:
            db.create_collection(SPEC, recreate=True)
            db.insert(np.arange(ROWS), rng.random((ROWS, DIM), dtype=np.float32))
            db.wait_searchable(ROWS, timeout=60)
            db.build_index(timeout=60)
        finally:
            db.close()
        queries = write_queries(tmp_path / "queries.parquet", rng)
        target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=SPEC)
        yield deployment, target, str(queries)
    finally:
        for proc in deployment.procs:  # never leave a frozen server behind
            if proc.alive:
                os.kill(proc.proc.pid, signal.SIGCONT)
        deployment.stop()


def _sweep(ef: list[int]) -> QuerySweepConfig:
    return QuerySweepConfig(
        ef=ef, batch_size=[10], clients=[1], k=[10], max_queries=None, warmup_queries=0, duration_s=1.0
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_frozen_server_is_bounded_retried_and_flagged(weaviate, tmp_path: Path) -> None:
    deployment, target, queries = weaviate
    pid = deployment.procs[0].proc.pid
    freeze = 40.0  # far longer than the 2 s request timeout: without timeouts the stage waits all of it
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        records = query_sweep(target, queries, _sweep([16]), str(tmp_path / "frozen"), None)
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert elapsed < freeze / 2, f"the query stage blocked {elapsed:.0f}s on a frozen server"
    [record] = records
    assert record.stalled and record.stalled.startswith("stalled twice")
    meta = pq.read_schema(record.file).metadata
    assert meta[b"stalled"].decode() == record.stalled

    # The server is back: the same setting runs normally and is not flagged.
    records = query_sweep(target, queries, _sweep([16]), str(tmp_path / "thawed"), None)
    assert records[0].stalled is None
    assert pq.read_table(records[0].file).num_rows == QUERIES  # the first answer to each distinct query
    assert records[0].window_s >= 1.0 and records[0].queries_sent >= QUERIES


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_readonly_shard_is_set_ready_before_a_setting(weaviate, tmp_path: Path) -> None:
    from apps.vdb.weaviate.client import class_name
    from apps.vdb.weaviate.rest import node_key, rest_json

    _, target, queries = weaviate
    node = target.endpoints.nodes[0]
    base = f"http://{node.host}:{node.port}/v1/schema/{class_name(SPEC.name)}/shards"
    key = node_key(node)  # the server requires the deployment's API key (Authorization: Bearer)
    assert key

    def shards() -> list[dict]:
        return rest_json(base, key, timeout=10)

    with pytest.raises(urllib.error.HTTPError) as refused:  # ... and refuses a request without it
        rest_json(base, None, timeout=10)
    assert refused.value.code == 401
    for shard in shards():
        rest_json(f"{base}/{shard['name']}", key, timeout=10, body={"status": "READONLY"})
    assert {s["status"] for s in shards()} == {"READONLY"}
    records = query_sweep(target, queries, _sweep([24, 48]), str(tmp_path / "out"), None)
    assert [r.stalled for r in records] == [None, None]
    assert {s["status"] for s in shards()} == {"READY"}


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_milvus_frozen_is_flagged_and_killed_gives_a_clear_error(tmp_path: Path) -> None:
    """Milvus frozen during a setting: bounded and flagged; killed after the collection exists: the client's
    error crosses the Parsl boundary as DatabaseError (it used to end as WorkerLost / RecursionError)."""
    from apps.vdb.milvus.client import MilvusVectorClient
    from apps.vdb.milvus.deploy import MilvusDeployment
    from apps.vdb.milvus.settings import MilvusSettings

    settings = MilvusSettings(request_timeout=3.0, min_segment_rows_to_index=0)
    deployment = MilvusDeployment(settings)
    group = None
    try:
        endpoints = deployment.start(tmp_path / "milvus", timeout=240)
        group = deployment.proc.proc.pid  # the server's own process group (etcd included)
        spec = SPEC.model_copy(update={"index_type": "flat"})
        rng = np.random.default_rng(3)
        db = MilvusVectorClient(settings, endpoints)
        try:
            db.create_collection(spec, recreate=True)
            db.insert(np.arange(ROWS), rng.random((ROWS, DIM), dtype=np.float32))
            db.wait_searchable(ROWS, timeout=120)
            db.build_index(timeout=120)
        finally:
            db.close()
        queries = write_queries(tmp_path / "queries.parquet", rng)
        target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=spec)
        sweep = QuerySweepConfig(
            ef=[16], batch_size=[10], clients=[1], k=[10], max_queries=None, warmup_queries=0, duration_s=None
        )

        os.killpg(group, signal.SIGSTOP)
        try:
            started = time.monotonic()
            [record] = query_sweep(target, str(queries), sweep, str(tmp_path / "frozen"), None)
            elapsed = time.monotonic() - started
        finally:
            os.killpg(group, signal.SIGCONT)
        assert elapsed < 40, f"the query stage blocked {elapsed:.0f}s on a frozen server"
        assert record.stalled and record.stalled.startswith("stalled twice")

        db = MilvusVectorClient(settings, endpoints)
        try:
            db.create_collection(spec.model_copy(update={"name": "after_kill"}), recreate=True)
            os.killpg(group, signal.SIGKILL)
            back = _parsl_round_trip(lambda: db.insert(np.arange(10), np.zeros((10, DIM), np.float32)))
        finally:
            db.close()
        assert isinstance(back, DatabaseError) and "milvus" in str(back)
    finally:
        if group is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGCONT)
        deployment.stop()


def test_a_server_that_dies_mid_stage_fails_it_at_once_naming_it() -> None:
    """The driver's wait for a stage task watches the point's servers on this machine: one that dies
    ends the stage with a line naming it. Before, Weaviate's client retried the refused connection for
    63 s and the error was a five-line gRPC dump that never said the server was gone."""
    from concurrent.futures import Future

    from pipeline.vdb_stages import ServerDied, ServerWatch, dead_server

    server = subprocess.Popen(["sleep", "120"])  # a child of this process, as a local server is
    never: Future = Future()
    # Only a watch can end this wait: the safety net's error is not a ServerDied.
    safety = threading.Timer(60, lambda: never.set_exception(RuntimeError("the watch never fired")))
    try:
        pids = {"weaviate-server": server.pid}
        watch = ServerWatch("weaviate", pids, Path("/logs/server"))
        assert dead_server(pids) is None
        done: Future = Future()
        done.set_result(7)
        assert watch.result(done, "insert") == 7  # a finished task's result is its own
        threading.Timer(1.0, server.kill).start()
        safety.start()
        with pytest.raises(ServerDied) as error:
            watch.result(never, "query")
        assert str(error.value) == (
            f"weaviate: its server weaviate-server (pid {server.pid}) died during the query stage; "
            "its logs are in /logs/server"
        )
    finally:
        safety.cancel()
        server.kill()
        server.wait()
    assert dead_server(pids) == f"weaviate-server (pid {server.pid})"  # reaped: gone, still dead
