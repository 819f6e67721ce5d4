"""Vector-database stages of the DAG: deploy (pilot) -> insert -> index -> query sweep -> teardown -> report.

Every point of the sweep (pipeline/sweep.py: a database entry x swept values x repeat; one point per
database without a sweep) is its own chain, and points run one after another so they do not compete for
the same cores. The deploy task runs in the driver process and keeps the Deployment there, so teardown
always happens in a ``finally`` — on success, on a failed stage and on Ctrl-C — whatever worker the other
tasks ran on. Each finished point leaves ``<store>/vdb-points/<point key>/manifest.json`` (linked from the
stage directory under its label); a re-run repeats only the points without one, from scratch.
"""

from __future__ import annotations

import logging
import shutil
import socket
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from parsl import python_app
from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from apps.dataset.groundtruth.checkpoints import loaded_rows
from apps.telemetry.collector import DatabaseTelemetry
from apps.vdb import database, runs_in_process
from apps.vdb.base import CollectionSpec, DatabaseError, Deployment
from apps.vdb.binding import bind_local
from apps.vdb.config import DatabaseSettings, VdbConfig
from apps.vdb.records import (
    DatabaseOutcome,
    DatabaseTarget,
    Deployed,
    InsertPart,
    InsertRecord,
    Searchable,
)
from apps.vdb.server_facts import observe_servers
from apps.vdb.stages import index as index_stage
from apps.vdb.stages import insert as insert_stage
from apps.vdb.stages import mixed as mixed_stage
from apps.vdb.stages import query_sweep as query_stage
from core.errors import ArtifactError, describe
from core.store import atomic_write_json, atomic_write_text, file_entry, read_manifest
from executors.labels import DRIVER
from executors.platforms import cpu_label
from pipeline.plan import Plan
from pipeline.progress import StageProgress, warn
from pipeline.provenance import Provenance
from pipeline.report_stage import write_benchmark_report
from pipeline.sweep import PointPlan, expected_seconds, point_manifest

log = logging.getLogger(__name__)


def deploy(deployment: Deployment, workdir: str, timeout: float) -> Deployed:
    """Driver-side task: start the servers and time it; the Deployment stays in the driver for teardown."""
    started = time.time()
    endpoints = deployment.start(Path(workdir), timeout)  # returns once every endpoint is healthy
    deploy_s = time.time() - started
    servers = observe_servers(deployment.name, deployment.server_pids(), deployment.wildcard_reason)
    return Deployed(endpoints=endpoints, deploy_s=deploy_s, servers=servers)


SERVER_CHECK_S = 1.0  # how often a stage's wait looks at this machine's servers


class ServerDied(DatabaseError):
    """A server of the point's deployment exited while a stage ran (killed, crashed, OOM-killed)."""


def dead_server(pids: dict[str, int]) -> str | None:
    """``name (pid N)`` of the first of ``pids`` that no longer runs; None when all do. The servers are
    this process's children, so one that died stays a zombie (its pid not reused) until teardown."""
    for name, pid in pids.items():
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            pass
        except psutil.Error:  # cannot be read (access): not known to be dead
            continue
        return f"{name} (pid {pid})"
    return None


def wait_watching(future: Future, pids: dict[str, int], died: str) -> Any:
    """``future``'s result; ServerDied (``died``, with the server named) at once when one of ``pids``
    dies first. Without this the clients retry a refused connection for a minute, and end with a gRPC
    dump that never says the server is gone."""
    while not wait([future], timeout=SERVER_CHECK_S).done:
        if (dead := dead_server(pids)) is not None:
            raise ServerDied(died.format(server=dead))
    return future.result()


@dataclass(frozen=True)
class ServerWatch:
    """The running point's servers on this machine, watched while its stage tasks run."""

    database: str
    pids: dict[str, int]  # server name -> pid
    logs: Path  # their log folder, named when one dies

    def result(self, future: Future, stage: str) -> Any:
        """A stage task's result; ServerDied at once when one of the servers dies meanwhile."""
        where = f"its logs are in {self.logs}"
        died = f"{self.database}: its server {{server}} died during the {stage} stage; {where}"
        return wait_watching(future, self.pids, died)


def client_node() -> str:
    """Client-block task: the node it runs on (asked before a pilot starts, so the block is up)."""
    return socket.gethostname()


def read_outcome(db_dir: Path, key: str | None = None) -> DatabaseOutcome | None:
    """The outcome of a point finished by an earlier run, or None (never run, partial, damaged, other
    layout). A damaged point is measured again from scratch: the plan named its damage on the console,
    the log keeps it."""
    try:
        manifest = point_manifest(db_dir)
    except ArtifactError as exc:
        log.info("%s; measuring the point again", exc)
        return None
    if manifest is None or (key is not None and manifest.get("key") != key):
        return None
    try:
        return DatabaseOutcome.model_validate(manifest)
    except ValidationError:
        log.info("%s: manifest from another record layout; benchmarking again", db_dir)
        return None


class VdbStages:
    """Runs the vector-database stages of the DAG for every configured database and writes the report.

    (Not to be confused with ``benchmarks/``, the harness that measures this pipeline's own overheads.)
    """

    def __init__(self, plan: Plan, provenance: Provenance, progress: StageProgress) -> None:
        self.plan, self.provenance, self.progress = plan, provenance, progress
        self._point = ""  # the point being measured, as the console names it
        self.cfg = plan.config.vdb
        self.stage = plan.stage("vdb")
        clients = cpu_label(plan.config.executor)  # clients run on nodes separate from the database's
        self.apps = {
            "deploy": python_app(deploy, executors=[DRIVER]),
            "client_node": python_app(client_node, executors=[clients]),
            "prepare": python_app(insert_stage.prepare_collection, executors=[clients]),
            "insert": python_app(insert_stage.insert_partition, executors=[clients]),
            "searchable": python_app(insert_stage.wait_searchable, executors=[clients]),
            "index": python_app(index_stage.build_index, executors=[clients]),
            "query": python_app(query_stage.query_sweep, executors=[clients]),
            "mixed": python_app(mixed_stage.mixed_workload, executors=[clients]),
        }

    def spec(self, cfg: VdbConfig, settings: DatabaseSettings | None = None) -> CollectionSpec:
        """The collection ``settings``' database builds under ``cfg``; the metric is the ground truth's.

        With a cluster, an in-process engine (Qdrant edge) is one rank inside its client: one shard.
        """
        fields = cfg.collection.model_dump()
        if cfg.cluster is not None and runs_in_process(settings):
            fields["shards"] = 1
        return CollectionSpec(dim=self.plan.dimension, metric=self.plan.config.groundtruth.metric, **fields)

    def run(self) -> dict[str, Any]:
        """Benchmark every point not yet done, in order; then write results.parquet and report.md."""
        directory = self.stage.directory
        directory.mkdir(parents=True, exist_ok=True)
        # Server logs, endpoints and raw results of this run, reachable from the run directory.
        (self.provenance.run_dir / "vdb").symlink_to(directory, target_is_directory=True)
        # The ETA weighs each point by the time `plan` expects of it: one of hours is not one of seconds.
        resources = self.plan.resources
        estimates = {id(point): found for point, found in resources.estimates} if resources else {}
        local = self.cfg.cluster is None
        weights = expected_seconds(self.plan.points, estimates, local)
        expected = {point.number: weight for point, weight in zip(self.plan.points, weights, strict=True)}
        self.progress.add_stage("vdb", len(self.plan.points), expected_s=sum(expected.values()))
        self.provenance.stages["vdb"]["planned_points"] = len(self.plan.points)  # `status` counts against it
        done_before = {
            point.number: outcome
            for point in self.plan.points
            if (outcome := read_outcome(point.directory, point.key)) is not None
        }
        for point in self.plan.points:  # named, and off the bar, at once: its count and ETA are of the rest
            if point.number in done_before:
                line = f"point {point.number} {point.label} (repeat {point.point.repeat}): done before"
                self.progress.console.print(line, highlight=False, markup=False)
                log.info("%s: %s", line, point.directory)
                self.progress.advance("vdb", reused=True, expected_s=expected[point.number])
        outcomes: list[DatabaseOutcome] = []
        for point in self.plan.points:
            # Linked before it runs: the stage directory shows a point's logs and raw files as they come.
            _link(directory / point.link, point.directory)
            outcome = done_before.get(point.number) or self.run_point(point)
            outcomes.append(outcome)
            # The points this run's report rests on (run or reused): `pipeline report <run>` reads them.
            self.provenance.stages["vdb"].setdefault("points", []).append(
                {
                    "label": point.label,
                    "repeat": point.point.repeat,
                    "key": point.key,
                    "link": point.link,
                    "directory": str(point.directory),
                    "status": outcome.status,
                    "reused": point.number in done_before,
                }
            )
            if point.number not in done_before:  # a point: its count is the bar's own
                weight = expected[point.number]
                if outcome.status == "succeeded":
                    self.progress.advance("vdb", expected_s=weight)
                else:  # ended without its work: the ETA's pace is not its
                    self.progress.advance("vdb", dropped_s=weight)
        report = write_benchmark_report(
            self.plan, outcomes, directory / "report", self.provenance.run_dir.name
        )
        if all(o.status == "succeeded" for o in outcomes):
            atomic_write_json(
                directory / "manifest.json",
                {
                    "key": self.stage.key,
                    "files": report["files"],
                    "databases": sorted({o.database for o in outcomes}),
                    "points": [
                        {"label": p.label, "repeat": p.point.repeat, "key": p.key} for p in self.plan.points
                    ],
                },
            )
        return report

    def run_point(self, point: PointPlan) -> DatabaseOutcome:
        """Deploy one point's database, run its stages, always tear it down; write and return the outcome."""
        cfg, settings, db_dir = point.point.config, point.point.settings, point.directory
        name = settings.name
        pilot = cfg.cluster is not None and not runs_in_process(settings)
        if pilot:
            # HPC: the servers as a pilot job on their own nodes, in this point's shape
            from apps.vdb.cluster.pilot import cluster_deployment

            run_config = self.plan.config.model_copy(update={"vdb": cfg})
            deployment = cluster_deployment(settings, run_config, self.plan.loaded.base_dir)
        else:  # servers on this machine: vdb.cores_per_worker threads, pinned with vdb.bind: cores
            settings, cpus = bind_local(settings, cfg.cores_per_worker, cfg.bind)
            deployment = database(name).deployment(settings)
            deployment.cpus = cpus
        if db_dir.exists():
            shutil.rmtree(db_dir)  # a partial earlier attempt: start clean
        db_dir.mkdir(parents=True)
        log.info("point %d %s (repeat %d): %s", point.number, point.label, point.point.repeat, db_dir)
        self._point = f"point {point.number} {point.label}"  # as the other point messages name it
        self.progress.phase("vdb", f"{self._point}: deploy")
        fields: dict[str, Any] = {
            "database": name,
            "label": point.label,
            "repeat": point.point.repeat,
            "key": point.key,
            "params": point.point.params,
            "settings": settings,
            "collection": self.spec(cfg, settings),
        }
        started, endpoints = time.time(), None
        # never raises; a pilot's rank samplers' files are merged in after teardown
        rank_files = getattr(deployment, "telemetry_files", None)
        self.telemetry = DatabaseTelemetry(db_dir, deployment.server_pids, rank_files=rank_files)
        try:
            self.telemetry.start()
            if pilot:
                # The clients' block must be running before the database job starts: a pilot that waits
                # for a queued client block burns its walltime (a task on that block brings it up).
                self.apps["client_node"]().result()
            deployed = self.apps["deploy"](deployment, str(db_dir / "server"), cfg.startup_timeout_s).result()
            endpoints = deployed.endpoints.model_dump()
            self.telemetry.attach(deployed.endpoints)
            atomic_write_json(db_dir / "endpoints.json", endpoints)
            fields.update(
                server_version=deployed.endpoints.server_version,
                deploy_s=deployed.deploy_s,
                servers=deployed.servers,
            )
            target = DatabaseTarget(
                settings=settings, endpoints=deployed.endpoints, collection=fields["collection"]
            )
            watch = ServerWatch(name, deployment.server_pids(), db_dir / "server")
            try:
                fields.update(self._stages(cfg, target, db_dir, watch), status="succeeded")
            except Exception as exc:
                lost = getattr(deployment, "lost", lambda: None)()  # a pilot job that ended mid-stage
                if lost:
                    raise DatabaseError(lost) from exc
                dead = None if isinstance(exc, ServerDied) else dead_server(watch.pids)
                if dead is not None:  # the clients noticed first: say why they failed
                    first_line = describe(exc).splitlines()[0][:300]
                    raise ServerDied(
                        f"{name}: its server {dead} died (the stage then failed with {first_line}); its "
                        f"logs are in {db_dir / 'server'}"
                    ) from exc
                raise
        except DatabaseError as exc:
            if name not in self.cfg.optional:
                raise
            log.warning("%s skipped (optional): %s", point.label, exc)
            fields.update(status="skipped", reason=str(exc))
        finally:
            self.telemetry.phase("teardown")
            teardown = None
            try:
                deployment.stop()
            except Exception as exc:  # a failed teardown must not hide the stage's own error
                # Said, not raised: the point's figures stand, but a server or pilot job may outlive it.
                teardown = f"{point.label}: teardown failed: {describe(exc).splitlines()[0][:300]}"
                log.error("%s", teardown)
                warn(
                    self.progress.console,
                    f"{teardown}; its server or job may still run ({db_dir / 'server'})",
                )
            self.telemetry.stop()  # writes <db_dir>/telemetry.parquet; logs, never raises
            # The provenance gets what is known even when a stage failed (no raw-file list: it is long).
            known = {k: v for k, v in fields.items() if k != "queries"}
            record = {**_json(known), "endpoints": endpoints, "started": started, "finished": time.time()}
            self.provenance.task_finished("vdb", record | ({"teardown_error": teardown} if teardown else {}))
        if fields.get("status") == "succeeded":  # a raw file lost or cut short later has the point redone
            fields["files"] = result_files(db_dir)
        outcome = DatabaseOutcome.model_validate(fields)
        path = db_dir / ("manifest.json" if outcome.status == "succeeded" else "skipped.json")
        atomic_write_text(path, outcome.model_dump_json(indent=2) + "\n")
        return outcome

    def _stages(
        self, cfg: VdbConfig, target: DatabaseTarget, db_dir: Path, watch: ServerWatch
    ) -> dict[str, Any]:
        """insert (every batch size) -> searchable -> index -> query sweep, chained by futures; each
        result waited for while ``watch`` watches the point's servers."""
        plan = self.plan
        dataset_dir = plan.stage("embed").directory
        # vdb.insert.rows: the first N rows only (a ValueError naming the field when N exceeds the dataset)
        rows = loaded_rows(read_manifest(dataset_dir)["rows"], cfg.insert.rows)
        units = insert_stage.work_units(str(dataset_dir), cfg.insert.rows)
        inserts = []
        searchable: Future | None = None
        for attempt, batch_size in enumerate(cfg.insert.batch_sizes):
            self._phase("insert", f"{rows:,} rows, batch {batch_size}")
            prepared = self.apps["prepare"](target, attempt > 0)
            watch.result(prepared, "insert")  # the collection must exist before any client attaches
            tasks = [
                self.apps["insert"](
                    target,
                    units[w :: cfg.insert.workers],
                    batch_size,
                    cfg.insert.clients_per_worker,
                    cfg.insert.retries,
                    worker=w,  # its clients are numbered from w x clients: spread over the entry ranks
                )
                for w in range(cfg.insert.workers)
            ]
            searchable = self.apps["searchable"](target, rows, cfg.insert.timeout_s, *tasks)
            sent = insert_stage.combine_parts([watch.result(t, "insert") for t in tasks])
            ready = watch.result(searchable, "insert")
            inserts.append(insert_record(sent, ready, batch_size, cfg.insert.workers))
        self._phase("index")
        index = self.apps["index"](target, rows, cfg.index_timeout_s, searchable)
        queries_file = str(plan.stage("queries").directory / "queries.parquet")
        query = self.apps["query"](target, queries_file, cfg.query, str(db_dir), index)
        index_record = watch.result(index, "index")
        self._phase("query")
        stages = {"insert": inserts, "index": index_record, "queries": watch.result(query, "query")}
        if (
            cfg.mixed is not None
        ):  # on a fresh collection: the task recreates and preloads it (apps/vdb/stages/mixed.py)
            self._phase("mixed")
            mixed = self.apps["mixed"](
                target,
                str(dataset_dir),
                queries_file,
                cfg.mixed,
                str(db_dir),
                cfg.insert.batch_sizes[-1],
                cfg.insert.rows,
            )
            stages["mixed"] = watch.result(mixed, "mixed")
        return stages

    def _phase(self, phase: str, detail: str = "") -> None:
        """A point's next phase: its telemetry's mark, and a word on the console (a point runs minutes)."""
        self.telemetry.phase(phase)
        self.progress.phase("vdb", f"{self._point}: {phase}" + (f" ({detail})" if detail else ""))


RESULT_FOLDERS = ("raw", "mixed")  # a point's measurements, read by the report


def result_files(db_dir: Path) -> list[dict[str, str | int]]:
    """The raw result files of a finished point, as a manifest lists them (name, bytes, sha256): so
    ``point_manifest`` sees one lost, cut short or damaged, and the point is measured again."""
    paths = [path for folder in RESULT_FOLDERS for path in sorted((db_dir / folder).glob("*.parquet"))]
    return [file_entry(path, str(path.relative_to(db_dir))) for path in paths]


def _link(link: Path, target: Path) -> None:
    """``link`` -> ``target`` (a point's directory under its label in the stage directory)."""
    if link.name in ("", ".", "..") or "/" in link.name:  # label_slug never gives these: never delete them
        raise ValueError(f"{link}: a point's link must be a plain name inside its stage directory")
    if link.is_symlink():
        link.unlink()
    elif link.exists():  # a database directory of the layout before sweeps
        shutil.rmtree(link)
    link.symlink_to(target, target_is_directory=True)


def insert_record(sent: InsertPart, visible: Searchable, batch_size: int, workers: int) -> InsertRecord:
    """One upload's record: upload time from the first request to every vector searchable."""
    first = sent.first_start if sent.first_start is not None else sent.last_end
    upload_s = visible.searchable_at - first
    return InsertRecord(
        batch_size=batch_size,
        request_size=sent.request_size,
        rows=sent.rows,
        clients=sent.clients,
        workers=workers,
        upload_s=upload_s,
        searchable_s=visible.searchable_at - sent.last_end,
        insert_vectors_per_s=sent.rows / max(upload_s, 1e-9),
    )


def _json(fields: dict[str, Any]) -> dict[str, Any]:
    """Records and settings as the JSON values the provenance file holds."""
    return {k: to_jsonable_python(v) for k, v in fields.items()}
