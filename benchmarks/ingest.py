"""Insert stage versus each vendor's own bulk-upload path, on the same data and the same server.

Both sides load the same real vectors (the project's dataset under ``store/datasets/``: 384-dim MiniLM
embeddings of the bundled abstracts; fmnist1k when no dataset was built) into a fresh collection made
by the project's ``prepare_collection`` (so the schema, index and segment settings are identical), with
the same batch size, against one server started by the adapter's Deployment class with the settings of
``configs/local.yaml``. Upload time is what ARCHITECTURE.md defines: first insert request sent -> every
vector visible to search.

* **vendor**: the vendor's documented bulk path, vectors already in memory (read before the clock):
  Weaviate ``collection.batch.fixed_size(batch_size)`` (its default 2 concurrent requests) and
  ``batch.dynamic()``, then ``batch.wait_for_vector_indexing()`` and the object count; pymilvus
  ``MilvusClient.insert`` of row dicts per batch, ``flush``, then a strong ``count(*)``; Qdrant edge
  ``EdgeShard.update(UpdateOperation.upsert_points(...))`` per batch, then the exact count; and
  qdrant-client ``upload_points`` in local mode (``qdrant-local``).
* **harness**: ``apps.insert.insert_partition`` (client processes, Parquet read per work unit) followed
  by ``apps.insert.wait_searchable``, with 1 and with 2 client processes; its upload time is the
  pipeline's ``upload_s`` (``searchable_at - first_start``). ``wall`` adds the pool start-up.
* diagnostic arms (same stage functions, not counted for the target): ``pre-connected`` runs
  ``insert_units`` on a ClientPool whose processes connected before the clock (what the lazy connect in
  the first timed batch costs); Milvus ``insert_mode=insert`` (the adapter's upsert versus insert).

Ratio = harness throughput / vendor throughput (medians over ``--repeats``; arms rotate order in each
repeat). Target >= 1.0x. Each upload also records the CPU seconds of the client side and of the server
process tree (the machine's cores are shared). ``--profile`` adds cProfile of one client's insert loop
(harness vs vendor, in this process) and the cost of a client process's lazy connect.

qdrant-client local mode is a pure-Python store (no segments, no HNSW; its SQLite file is put on
/dev/shm to keep disk noise out): its numbers compare the harness's qdrant-client code path with
``upload_points`` on the same local store, and are not comparable with the edge engine or a server.

    .venv/bin/python benchmarks/ingest.py                       # all databases, ~6 minutes on 2 cores
    .venv/bin/python benchmarks/ingest.py --databases milvus --batch-size 1024 --repeats 3 --profile
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

NAME = "ingest"
TARGET = 1.0
DATABASES = ("weaviate", "milvus", "qdrant", "qdrant-local")
LOCAL_CONFIG = _common.REPO / "configs" / "local.yaml"
FMNIST = Path("/work/shared/data/ann/fmnist1k/fmnist1k_base.fvecs")
COLLECTION = "ingest_bench"


# --- data --------------------------------------------------------------------------------------------------


def project_dataset() -> Path | None:
    """The newest complete dataset of the project's store (``store/datasets/*/manifest.json``)."""
    found = sorted(
        (p.parent for p in (_common.REPO / "store" / "datasets").glob("*/manifest.json")),
        key=lambda d: (d / "manifest.json").stat().st_mtime,
    )
    return found[-1] if found else None


def read_dataset(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ids, float32 vectors) of every part, in dataset order."""
    from apps.dataset import arrow_to_vectors, dataset_parts

    ids, vectors = [], []
    for part in dataset_parts(directory):
        table = pq.read_table(part, columns=["id", "embedding"])
        ids.append(table.column("id").to_numpy())
        vectors.append(arrow_to_vectors(table.column("embedding")))
    return np.concatenate(ids), np.concatenate(vectors)


def write_dataset(directory: Path, ids: np.ndarray, vectors: np.ndarray, sizes: list[int], rg: int) -> Path:
    """``ids``/``vectors`` in the project's dataset layout: parts of ``sizes`` rows, row groups ``rg``."""
    from apps.dataset import finalize_dataset, vectors_to_arrow
    from core.store import write_parquet_atomic

    directory.mkdir(parents=True, exist_ok=True)
    records, start = [], 0
    for shard, size in enumerate(sizes):
        rows = slice(start, start + size)
        start += size
        table = pa.table(
            {
                "id": ids[rows],
                "doc_id": ids[rows].astype(str),
                "chunk_index": np.zeros(size, np.int32),
                "embedding": vectors_to_arrow(vectors[rows], "float32"),
            }
        )
        name = f"part-{shard:05d}.parquet"
        written = write_parquet_atomic(table, directory / name, row_group_rows=rg)
        records.append({"file": name, "shard": shard, **written})
    finalize_dataset(str(directory), directory.name, records, {"dimension": vectors.shape[1]}, {})
    return directory


def bench_dataset(rows: int | None) -> dict[str, Any]:
    """The dataset both sides load: the project's (or its first ``rows``), else fmnist1k in 4 parts."""
    source = project_dataset()
    if source is not None:
        ids, vectors = read_dataset(source)
        label, metric, directory = f"store/datasets/{source.name}", "cosine", source
        if rows and rows < len(ids):  # the first rows, with the source's part boundaries
            from core.store import read_manifest

            sizes, left = [], rows
            for entry in read_manifest(source)["files"]:
                sizes.append(min(entry["rows"], left))
                left -= sizes[-1]
                if not left:
                    break
            ids, vectors = ids[:rows], vectors[:rows]
            directory = _common.OUT / "work" / f"ingest-{source.name}-{rows}"
            if not (directory / "manifest.json").exists():
                write_dataset(directory, ids, vectors, sizes, 8192)
            label += f" (first {rows} rows)"
    else:
        from apps.vecs import read_vecs

        base = read_vecs(FMNIST)[: rows or None]
        ids, vectors = np.arange(len(base), dtype=np.int64), base
        directory = _common.OUT / "work" / f"ingest-fmnist1k-{len(base)}"
        if not (directory / "manifest.json").exists():
            quarter = -(-len(base) // 4)
            sizes = [min(quarter, len(base) - i * quarter) for i in range(4)]
            write_dataset(directory, ids, vectors, [s for s in sizes if s > 0], 100)
        label, metric = f"fmnist1k ({FMNIST})", "l2"
    from apps.insert import work_units

    return {
        "dir": directory,
        "label": label,
        "metric": metric,
        "ids": ids,
        "vectors": vectors,
        "units": work_units(str(directory)),
    }


# --- configuration: the settings of configs/local.yaml -----------------------------------------------------


def vdb_config() -> Any:
    from pipeline.config import VdbConfig

    return VdbConfig.model_validate(yaml.safe_load(LOCAL_CONFIG.read_text())["vdb"])


def settings_for(database: str, cfg: Any) -> Any:
    """The adapter settings of ``database`` as configs/local.yaml gives them (qdrant-local: local mode)."""
    from apps.vdb import get_adapter

    name = "qdrant" if database == "qdrant-local" else database
    found = next((s for s in cfg.databases if s.name == name), None)
    settings = found or get_adapter(name).settings(name=name)
    if database == "qdrant-local":
        settings = settings.model_copy(update={"mode": "server", "url": None})  # local_path set at start
    return settings


# --- the harness: the project's insert stage ---------------------------------------------------------------


def _hold(seconds: float) -> int:
    """Pool function: connect this pool process's client, then stay busy so the next one lands elsewhere."""
    from apps.vdb import pool

    pool.client()
    time.sleep(seconds)
    return os.getpid()


def target_of(ctx: dict[str, Any], settings: Any | None = None) -> Any:
    """The stages' DatabaseTarget for this context (``settings`` overrides the context's)."""
    from apps.vdb.records import DatabaseTarget

    return DatabaseTarget(
        settings=settings or ctx["settings"], endpoints=ctx["endpoints"], collection=ctx["spec"]
    )


def _insert_preconnected(ctx: dict[str, Any], target: Any, clients: int) -> tuple[Any, float]:
    """insert_partition's body (apps/insert.py) on a pool whose clients connected before the clock."""
    from apps.insert import combine_parts, insert_units
    from apps.vdb.pool import ClientPool

    with ClientPool(clients, target) as pool:
        pids = {f.result() for f in [pool.submit(_hold, 0.5) for _ in range(pool.size)]}
        if len(pids) != pool.size:
            raise SystemExit(f"pre-connect: {len(pids)} of {pool.size} pool processes connected")
        called = time.time()
        units = ctx["data"]["units"]
        futures = [
            pool.submit(insert_units, units[c :: pool.size], ctx["batch_size"], ctx["retries"])
            for c in range(pool.size)
        ]
        record = combine_parts([f.result() for f in futures])
    return record, called


def harness_upload(
    ctx: dict[str, Any], clients: int, settings: Any | None = None, preconnect: bool = False
) -> dict[str, Any]:
    """prepare_collection (fresh) -> insert_partition -> wait_searchable, as a pipeline run does.

    ``preconnect`` (diagnostic): the same stage functions, but every client process connects before the
    clock starts, to show what the lazy connect inside the first timed batch costs.
    """
    from apps.insert import insert_partition, prepare_collection, wait_searchable

    target = target_of(ctx, settings)
    prepare_collection(target, True)
    cpu = CpuMeter(ctx["server_pids"])
    if preconnect:
        record, called = _insert_preconnected(ctx, target, clients)
    else:
        called = time.time()
        record = insert_partition(target, ctx["data"]["units"], ctx["batch_size"], clients, ctx["retries"])
    returned = time.time()
    visible = wait_searchable(target, len(ctx["data"]["ids"]), ctx["timeout"], record)
    first, last, searchable_at = record.first_start, record.last_end, visible.searchable_at
    return {
        "rows": record.rows,
        "clients": record.clients,
        "batches": record.batches,
        "retried": record.retried,
        "upload_s": searchable_at - first,
        "send_s": last - first,
        "visible_s": searchable_at - last,
        "pool_close_s": returned - last,
        "wait_searchable_s": searchable_at - returned,
        "startup_s": first - called,
        "wall_s": searchable_at - called,
        "count": visible.count,
        **cpu.read(),
    }


class CpuMeter:
    """CPU seconds since creation: this process, its reaped children (pool clients), the server tree."""

    def __init__(self, server_pids: list[int]) -> None:
        self.server_pids = server_pids
        self.start = self._snapshot()

    def _snapshot(self) -> tuple[float, float, float]:
        import resource

        import psutil

        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # pool processes, once joined
        server = 0.0
        for pid in self.server_pids:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(pid)
                for proc in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        t = proc.cpu_times()
                        server += t.user + t.system
        return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime, server

    def read(self) -> dict[str, float]:
        end = self._snapshot()
        own, kids, server = (b - a for a, b in zip(self.start, end, strict=True))
        return {"client_cpu_s": own + kids, "server_cpu_s": server}


# --- the vendors' bulk paths -------------------------------------------------------------------------------


def _batches(ids: np.ndarray, vectors: np.ndarray, size: int):
    for start in range(0, len(ids), size):
        yield ids[start : start + size], vectors[start : start + size]


def _poll(check: Callable[[], int], expected: int, timeout: float, what: str, interval: float = 0.05) -> int:
    deadline = time.monotonic() + timeout
    while (seen := check()) != expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: {seen} of {expected} rows visible after {timeout:.0f}s")
        time.sleep(interval)
    return seen


class WeaviateVendor:
    """weaviate-client v4 batching, as Weaviate's import guide shows."""

    def __init__(self, ctx: dict[str, Any]) -> None:
        import weaviate
        from weaviate.classes.init import AdditionalConfig, Timeout

        from apps.vdb.weaviate.client import class_name

        node = ctx["endpoints_model"].nodes[0]
        self.client = weaviate.connect_to_custom(
            http_host=node.host,
            http_port=node.port,
            http_secure=False,
            grpc_host=node.host,
            grpc_port=node.grpc_port,
            grpc_secure=False,
            additional_config=AdditionalConfig(timeout=Timeout(init=30, query=120, insert=300)),
        )
        self.name = class_name(ctx["spec"]["name"])

    def upload(self, ctx: dict[str, Any], mode: str) -> dict[str, Any]:
        ids, vectors, size = ctx["data"]["ids"], ctx["data"]["vectors"], ctx["batch_size"]
        collection = self.client.collections.use(self.name)
        started = time.time()
        batcher = collection.batch.dynamic() if mode == "dynamic" else collection.batch.fixed_size(size)
        with batcher as batch:
            for i, vector in zip(ids.tolist(), vectors, strict=True):
                batch.add_object(properties={}, uuid=uuid.UUID(int=i), vector=vector)
        sent = time.time()
        failed = collection.batch.failed_objects
        if failed:
            raise SystemExit(f"weaviate {mode}: {len(failed)} objects failed; first: {failed[0].message}")
        collection.batch.wait_for_vector_indexing()

        def count() -> int:
            return int(collection.aggregate.over_all(total_count=True).total_count or 0)

        seen = _poll(count, len(ids), ctx["timeout"], f"weaviate {mode}")
        return _vendor_record(started, sent, time.time(), len(ids), seen)

    def close(self) -> None:
        self.client.close()


class MilvusVendor:
    """pymilvus ``MilvusClient.insert`` per batch of row dicts, then ``flush`` (Milvus's bulk advice)."""

    def __init__(self, ctx: dict[str, Any]) -> None:
        from pymilvus import MilvusClient

        node, settings = ctx["endpoints_model"].nodes[0], ctx["settings"]
        self.client = MilvusClient(uri=f"http://{node.host}:{node.port}", timeout=settings.request_timeout)
        self.name = ctx["spec"]["name"]

    def upload(self, ctx: dict[str, Any], mode: str) -> dict[str, Any]:
        from apps.vdb.milvus.client import ID_FIELD, VECTOR_FIELD

        ids, vectors, size = ctx["data"]["ids"], ctx["data"]["vectors"], ctx["batch_size"]
        started = time.time()
        for batch_ids, batch_vectors in _batches(ids, vectors, size):
            rows = [
                {ID_FIELD: i, VECTOR_FIELD: v}
                for i, v in zip(batch_ids.tolist(), batch_vectors.tolist(), strict=True)
            ]
            self.client.insert(self.name, rows)
        sent = time.time()
        self.client.flush(self.name)

        def count() -> int:
            res = self.client.query(
                self.name, filter="", output_fields=["count(*)"], consistency_level="Strong"
            )
            return int(res[0]["count(*)"])

        seen = _poll(count, len(ids), ctx["timeout"], "milvus insert")
        return _vendor_record(started, sent, time.time(), len(ids), seen)

    def close(self) -> None:
        self.client.close()


class EdgeVendor:
    """qdrant-edge-py: ``EdgeShard.update(UpdateOperation.upsert_points(points))`` per batch."""

    def __init__(self, ctx: dict[str, Any]) -> None:
        self.path = Path(ctx["endpoints_model"].data_dir) / ctx["spec"]["name"]

    def upload(self, ctx: dict[str, Any], mode: str) -> dict[str, Any]:
        from qdrant_edge import CountRequest, EdgeShard, Point, UpdateOperation

        ids, vectors, size = ctx["data"]["ids"], ctx["data"]["vectors"], ctx["batch_size"]
        shard = EdgeShard.load(str(self.path))  # made by prepare_collection: same config as the harness
        try:
            started = time.time()
            for batch_ids, batch_vectors in _batches(ids, vectors, size):
                points = [
                    Point(i, v) for i, v in zip(batch_ids.tolist(), batch_vectors.tolist(), strict=True)
                ]
                shard.update(UpdateOperation.upsert_points(points))
            sent = time.time()
            seen = _poll(lambda: shard.count(CountRequest(exact=True)), len(ids), ctx["timeout"], "edge")
            return _vendor_record(started, sent, time.time(), len(ids), seen)
        finally:
            shard.close()

    def close(self) -> None:
        pass


class LocalModeVendor:
    """qdrant-client ``upload_points`` against qdrant-client's local mode (pure Python: see docstring)."""

    def __init__(self, ctx: dict[str, Any]) -> None:
        self.location = ctx["settings"].local_path
        self.name = ctx["spec"]["name"]

    def upload(self, ctx: dict[str, Any], mode: str) -> dict[str, Any]:
        from qdrant_client import QdrantClient
        from qdrant_client import models as m

        ids, vectors, size = ctx["data"]["ids"], ctx["data"]["vectors"], ctx["batch_size"]
        client = QdrantClient(path=self.location)  # one opener at a time: closed before the harness runs
        try:
            started = time.time()
            points = (
                m.PointStruct(id=i, vector=v) for i, v in zip(ids.tolist(), vectors.tolist(), strict=True)
            )
            client.upload_points(self.name, points=points, batch_size=size, wait=True)
            sent = time.time()
            seen = _poll(lambda: client.count(self.name, exact=True).count, len(ids), ctx["timeout"], "local")
            return _vendor_record(started, sent, time.time(), len(ids), seen)
        finally:
            client.close()

    def close(self) -> None:
        pass


def _vendor_record(started: float, sent: float, visible: float, rows: int, count: int) -> dict[str, Any]:
    return {
        "rows": rows,
        "upload_s": visible - started,
        "send_s": sent - started,
        "visible_s": visible - sent,
        "wall_s": visible - started,
        "count": count,
    }


VENDORS = {
    "weaviate": (WeaviateVendor, ["fixed_size", "dynamic"]),
    "milvus": (MilvusVendor, ["insert"]),
    "qdrant": (EdgeVendor, ["upsert_points"]),
    "qdrant-local": (LocalModeVendor, ["upload_points"]),
}
VENDOR_LABELS = {
    "fixed_size": "vendor batch.fixed_size({b})",
    "dynamic": "vendor batch.dynamic()",
    "insert": "vendor insert({b}) + flush",
    "upsert_points": "vendor edge upsert_points({b})",
    "upload_points": "vendor upload_points({b}) [local mode]",
}


def vendor_upload(ctx: dict[str, Any], vendor: Any, mode: str) -> dict[str, Any]:
    from apps.insert import prepare_collection

    prepare_collection(target_of(ctx), True)
    cpu = CpuMeter(ctx["server_pids"])
    return {**vendor.upload(ctx, mode), **cpu.read()}


# --- profiling (``--profile``) -----------------------------------------------------------------------------


def _top(profile: cProfile.Profile, n: int = 14) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(n)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    head = next((ln.strip() for ln in lines if "function calls" in ln), "")
    return "\n".join([f"    {head}", *(f"    {ln}" for ln in lines[start:])])


def _time_first_client() -> dict[str, float]:
    """Pool function: what the first batch of a fresh client process pays before its first request."""
    from apps.vdb import pool

    started = time.perf_counter()
    pool.client()
    return {"lazy_connect_s": time.perf_counter() - started}


def profile_database(ctx: dict[str, Any], vendor: Any, mode: str) -> dict[str, Any]:
    """cProfile of one client's insert loop (harness's insert_units vs the vendor path) in this process."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from apps.insert import insert_units, prepare_collection
    from apps.vdb import pool

    target = target_of(ctx)
    result: dict[str, Any] = {}
    if not ctx["endpoints_model"].in_process:
        with ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"), initializer=pool.connect, initargs=(target,)
        ) as executor:
            result.update(executor.submit(_time_first_client).result())
    prepare_collection(target, True)
    pool.connect(target)
    harness = cProfile.Profile()
    started = time.perf_counter()
    harness.runcall(insert_units, ctx["data"]["units"], ctx["batch_size"], 0)
    result["harness_loop_s"] = time.perf_counter() - started
    pool.disconnect()
    vendor_profile = cProfile.Profile()
    started = time.perf_counter()
    vendor_profile.runcall(vendor_upload, ctx, vendor, mode)
    result["vendor_upload_s"] = time.perf_counter() - started
    result["harness_top"], result["vendor_top"] = _top(harness), _top(vendor_profile)
    return result


# --- driver ------------------------------------------------------------------------------------------------


def server_pids(deployment: Any) -> list[int]:
    """Pids of the server processes a Deployment started (none for an in-process engine)."""
    procs = [*(getattr(deployment, "procs", None) or []), getattr(deployment, "proc", None)]
    return [p.proc.pid for p in procs if p is not None and getattr(p, "proc", None) is not None]


def parquet_read_s(units: list[tuple[str, int]]) -> float:
    """What insert_units spends reading and converting every work unit (apps/insert.py), best of 3."""
    from apps.dataset import arrow_to_vectors

    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for part, row_group in units:
            table = pq.ParquetFile(part).read_row_group(row_group, columns=["id", "embedding"])
            table.column("id").to_numpy()
            arrow_to_vectors(table.column("embedding"))
        best = min(best, time.perf_counter() - started)
    return best


def run_database(database: str, data: dict[str, Any], cfg: Any, args: argparse.Namespace) -> dict[str, Any]:
    from apps.vdb import get_adapter
    from apps.vdb.base import CollectionSpec

    adapter_name = "qdrant" if database == "qdrant-local" else database
    adapter = get_adapter(adapter_name)
    settings = settings_for(database, cfg)
    work = Path(tempfile.mkdtemp(prefix=f"ingest-{database}-", dir=_common.OUT / "work"))
    if database == "qdrant-local":  # on tmpfs: local mode commits every point to SQLite (fsync noise)
        shm = Path("/dev/shm")
        local = Path(tempfile.mkdtemp(prefix="ingest-local-", dir=shm if shm.is_dir() else work)) / "local"
        settings = settings.model_copy(update={"local_path": str(local)})
    spec = CollectionSpec(
        name=COLLECTION,
        dim=data["vectors"].shape[1],
        metric=data["metric"],
        **cfg.collection.model_dump(exclude={"name"}),
    )
    deployment = adapter.deployment(settings)
    runs: list[dict[str, Any]] = []
    profile = None
    vendor = None
    try:
        started = time.monotonic()
        endpoints = deployment.start(work / "server", cfg.startup_timeout_s)
        startup = time.monotonic() - started
        ctx = {
            "adapter_name": adapter_name,
            "settings": settings,
            "endpoints": endpoints.model_dump(),
            "endpoints_model": endpoints,
            "spec": spec.model_dump(),
            "data": data,
            "batch_size": args.batch_size,
            "retries": cfg.insert.retries,
            "timeout": cfg.insert.timeout_s,
            "server_pids": server_pids(deployment),
        }
        vendor_cls, modes = VENDORS[database]
        vendor = vendor_cls(ctx)
        arms: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            (
                VENDOR_LABELS[mode].format(b=args.batch_size),
                lambda mode=mode: vendor_upload(ctx, vendor, mode),
            )
            for mode in modes
        ]
        clients = [1] if endpoints.in_process else [1, 2]
        arms += [(f"harness x{c}", lambda c=c: harness_upload(ctx, c)) for c in clients]
        if not endpoints.in_process:  # diagnostic: each client connects before the clock starts
            arms += [
                (f"harness x{c} pre-connected", lambda c=c: harness_upload(ctx, c, preconnect=True))
                for c in clients
            ]
        if database == "milvus" and settings.insert_mode != "insert":  # isolates upsert vs insert
            plain = settings.model_copy(update={"insert_mode": "insert"})
            arms.append(("harness x1 insert_mode=insert", lambda: harness_upload(ctx, 1, plain)))
        print(f"\n{database}: {endpoints.server_version} started in {startup:.1f} s; {len(arms)} arms")
        for repeat in range(args.repeats):
            shift = repeat % len(arms)
            for arm, fn in arms[shift:] + arms[:shift]:  # rotate the order in every repeat
                record = {"database": database, "arm": arm, "repeat": repeat, **fn()}
                record["vectors_per_s"] = record["rows"] / record["upload_s"]
                runs.append(record)
                extra = (
                    f" [pool close {record['pool_close_s']:.2f}, start-up {record['startup_s']:.2f}]"
                    if "startup_s" in record
                    else ""
                )
                print(
                    f"  [{repeat + 1}/{args.repeats}] {arm:<40} upload {record['upload_s']:6.2f} s "
                    f"(send {record['send_s']:5.2f} + visible {record['visible_s']:5.2f}){extra}  "
                    f"{record['vectors_per_s']:7.0f} vec/s  cpu client {record['client_cpu_s']:5.2f} "
                    f"server {record['server_cpu_s']:5.2f} s",
                    flush=True,
                )
        if args.profile:
            profile = profile_database(ctx, vendor, modes[0])
    finally:
        if vendor is not None:
            with contextlib.suppress(Exception):
                vendor.close()
        deployment.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            if database == "qdrant-local":
                shutil.rmtree(Path(settings.local_path).parent, ignore_errors=True)
    return {
        "database": database,
        "server_version": endpoints.server_version,
        "settings": settings.model_dump(mode="json"),
        "spec": spec.model_dump(),
        "runs": runs,
        "profile": profile,
    }


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median per (database, arm); ratios of every harness arm against the first (primary) vendor arm."""
    rows = []
    for result in results:
        arms: dict[str, list[dict[str, Any]]] = {}
        for run in result["runs"]:
            arms.setdefault(run["arm"], []).append(run)
        medians = {
            arm: {
                key: statistics.median(r[key] for r in runs)
                for key in ("upload_s", "send_s", "visible_s", "wall_s", "client_cpu_s", "server_cpu_s")
            }
            for arm, runs in arms.items()
        }
        vendor_arms = [a for a in arms if a.startswith("vendor")]
        primary = vendor_arms[0]
        best = min(vendor_arms, key=lambda a: medians[a]["upload_s"])
        for arm, med in medians.items():
            rows_n = arms[arm][0]["rows"]
            row = {
                "database": result["database"],
                "arm": arm,
                "n": len(arms[arm]),
                **med,
                "vectors_per_s": rows_n / med["upload_s"],
                "upload_s_all": [round(r["upload_s"], 3) for r in arms[arm]],
            }
            if arm.startswith("harness"):
                row["ratio"] = medians[primary]["upload_s"] / med["upload_s"]
                row["ratio_vs_best_vendor"] = medians[best]["upload_s"] / med["upload_s"]
                row["ratio_wall"] = medians[primary]["upload_s"] / med["wall_s"]
                row["vendor"], row["best_vendor"] = primary, best
                for key in ("startup_s", "pool_close_s", "wait_searchable_s"):
                    row[key] = statistics.median(r[key] for r in arms[arm])
            rows.append(row)
    return rows


def print_summary(rows: list[dict[str, Any]], data: dict[str, Any], args: argparse.Namespace) -> None:
    n = len(data["ids"])
    print(
        f"\ningest: {n} vectors x {data['vectors'].shape[1]} dims ({data['label']}), batch size "
        f"{args.batch_size}, median of {args.repeats}; upload = first request -> all rows visible\n"
    )
    header = (
        f"{'database':<13}{'arm':<38}{'upload s':>9}{'send':>7}{'visible':>8}{'vec/s':>7}"
        f"{'ratio':>7}{'vs best':>8}{'wall':>7}{'cpu cli':>8}{'cpu srv':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else ""
        best = f"{r['ratio_vs_best_vendor']:.2f}x" if "ratio" in r else ""
        wall = f"{r['ratio_wall']:.2f}x" if "ratio" in r else ""
        print(
            f"{r['database']:<13}{r['arm']:<38}{r['upload_s']:9.2f}{r['send_s']:7.2f}{r['visible_s']:8.2f}"
            f"{r['vectors_per_s']:7.0f}{ratio:>7}{best:>8}{wall:>7}{r['client_cpu_s']:8.2f}"
            f"{r['server_cpu_s']:8.2f}"
        )
    print(
        "\nratio = harness / vendor throughput = vendor upload time / harness upload time (vendor = the "
        "first vendor arm of the database, same batch size); 'vs best' against the fastest vendor arm; "
        "'wall' counts the harness from the insert_partition call (client process start-up included). "
        "cpu cli = CPU seconds of the client side (this process + its client processes; for qdrant "
        "edge the engine runs in-process and is included), cpu srv = the server's process tree."
    )
    for r in rows:
        if "pool_close_s" in r:
            print(
                f"  {r['database']:<12} {r['arm']:<30} harness visible phase = pool close "
                f"{r['pool_close_s']:.2f} s + wait_searchable {r['wait_searchable_s']:.2f} s; "
                f"client start-up before first_start {r['startup_s']:.2f} s"
            )
    print(f"  Parquet read + arrow_to_vectors of all {len(data['units'])} work units: {data['read_s']:.3f} s")
    by = {(r["database"], r["arm"]): r for r in rows}
    print("\nmultiprocessing (2 client processes vs 1; > 1.00x = faster with 2):")
    for database in dict.fromkeys(r["database"] for r in rows):
        for suffix in ("", " pre-connected"):
            one, two = by.get((database, f"harness x1{suffix}")), by.get((database, f"harness x2{suffix}"))
            if one and two:
                print(
                    f"  {database:<12} harness{suffix or ' (as the stage runs)':<20} upload "
                    f"{one['upload_s'] / two['upload_s']:.2f}x, "
                    f"send phase {one['send_s'] / two['send_s']:.2f}x, "
                    f"client CPU {one['client_cpu_s']:.1f} -> {two['client_cpu_s']:.1f} s, server CPU "
                    f"{one['server_cpu_s']:.1f} -> {two['server_cpu_s']:.1f} s"
                )
        if (database, "harness x2") not in by:
            print(f"  {database:<12} in-process engine: the pool is one thread whatever `clients` says")
    if any(r["database"] == "qdrant-local" for r in rows):
        print(
            "\nqdrant-local is qdrant-client's local mode (pure Python, SQLite on tmpfs): it compares the "
            "harness's qdrant-client code path with upload_points on that store only; not comparable with "
            "the edge engine or a Qdrant server."
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", nargs="+", choices=DATABASES, default=list(DATABASES))
    parser.add_argument("--batch-size", type=int, default=256, help="vectors per request (256)")
    parser.add_argument("--rows", type=int, default=None, help="first N rows of the dataset (default all)")
    parser.add_argument("--repeats", type=int, default=3, help="uploads per arm (median; default 3)")
    parser.add_argument("--profile", action="store_true", help="cProfile harness vs vendor client loops")
    parser.add_argument("--keep", action="store_true", help="keep the server work directories")
    args = parser.parse_args()
    (_common.OUT / "work").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    cfg = vdb_config()
    data = bench_dataset(args.rows)
    data["read_s"] = parquet_read_s(data["units"])
    print(
        f"{len(data['ids'])} vectors x {data['vectors'].shape[1]} from {data['label']}: "
        f"{len(data['units'])} work units; batch size {args.batch_size}; {args.repeats} repeats; "
        f"{_common.cores()} cores, load average {os.getloadavg()[0]:.2f}"
    )
    results = []
    for database in args.databases:
        results.append(run_database(database, data, cfg, args))
    rows = summarise(results)
    print_summary(rows, data, args)
    headline = []  # the target rows: the stage as a run uses it, against a real engine
    for r in rows:
        if r["arm"] in ("harness x1", "harness x2") and r["database"] != "qdrant-local":
            r["met"] = r["ratio"] >= TARGET
            headline.append(r)
            print(
                f"{r['database']:<13}{r['arm']:<14} harness/vendor = {r['ratio']:.2f}x (target >= "
                f"{TARGET}x): {'MET' if r['met'] else 'NOT MET'}"
            )
    for result in results:
        if result["profile"]:
            p = result["profile"]
            print(
                f"\nprofile {result['database']}: "
                + ", ".join(f"{k} {v:.2f} s" for k, v in p.items() if isinstance(v, float))
            )
            print(f"  harness insert_units (one client, in this process), by own time:\n{p['harness_top']}")
            print(f"  vendor path, by own time:\n{p['vendor_top']}")
    path = _common.write_json(
        NAME,
        {
            "dataset": data["label"],
            "rows": len(data["ids"]),
            "dim": int(data["vectors"].shape[1]),
            "work_units": len(data["units"]),
            "parquet_read_s": data["read_s"],
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "target": TARGET,
            "summary": headline,  # run_all.py: worst ratio of these rows against the target
            "arms": rows,  # every arm, diagnostics and qdrant-client local mode included
            "databases": results,
        },
    )
    print(f"raw numbers: {path}")


if __name__ == "__main__":
    main()
