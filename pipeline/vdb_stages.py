"""Vector-database stages of the DAG: deploy (pilot) -> insert -> index -> query sweep -> teardown -> report.

Databases run one after another so they do not compete for the same cores. The deploy task runs in the
driver process and keeps the Deployment there, so teardown always happens in a ``finally`` — on success,
on a failed stage and on Ctrl-C — whatever worker the other tasks ran on. Each finished database leaves
``<stage dir>/<database>/manifest.json``; a re-run repeats only the databases without one.
"""

from __future__ import annotations

import logging
import shutil
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from parsl import python_app

from apps import index as index_stage
from apps import insert as insert_stage
from apps import query_sweep as query_stage
from apps.vdb import get_adapter
from apps.vdb.base import CollectionSpec, DatabaseError
from core.store import atomic_write_json, complete_manifest, read_manifest
from executors.labels import DRIVER
from executors.platforms import cpu_label
from pipeline.plan import Plan
from pipeline.progress import StageProgress
from pipeline.provenance import Provenance

log = logging.getLogger(__name__)


def _deploy(deployment, workdir: str, timeout: float) -> dict[str, Any]:
    """Driver-side task: start the servers; the Deployment object stays in the driver for teardown."""
    return deployment.start(Path(workdir), timeout).model_dump()


class BenchmarkRunner:
    """Runs the VDB stages for every configured database and writes the report."""

    def __init__(self, plan: Plan, provenance: Provenance, progress: StageProgress) -> None:
        self.plan, self.provenance, self.progress = plan, provenance, progress
        self.cfg = plan.config.vdb
        self.stage = plan.stage("vdb")
        clients = cpu_label(plan.config.executor)  # clients run on nodes separate from the database's
        self.apps = {
            "deploy": python_app(_deploy, executors=[DRIVER]),
            "prepare": python_app(insert_stage.prepare_collection, executors=[clients]),
            "insert": python_app(insert_stage.insert_partition, executors=[clients]),
            "searchable": python_app(insert_stage.wait_searchable, executors=[clients]),
            "index": python_app(index_stage.build_index, executors=[clients]),
            "query": python_app(query_stage.query_sweep, executors=[clients]),
        }

    def spec(self) -> CollectionSpec:
        """The collection every database builds; the metric is the ground truth's."""
        return CollectionSpec(
            dim=self.plan.dimension,
            metric=self.plan.config.groundtruth.metric,
            **self.cfg.collection.model_dump(),
        )

    def run(self) -> dict[str, Any]:
        """Benchmark every database not yet done; then write results.parquet and report.md."""
        directory = self.stage.directory
        directory.mkdir(parents=True, exist_ok=True)
        # Server logs, endpoints and raw results of this run, reachable from the run directory.
        (self.provenance.run_dir / "vdb").symlink_to(directory, target_is_directory=True)
        self.progress.add_stage("vdb", len(self.cfg.databases))
        outcomes: dict[str, dict[str, Any]] = {}
        for settings in self.cfg.databases:
            db_dir = directory / settings.name
            done = complete_manifest(db_dir)
            if done is None:
                done = self.run_database(settings, db_dir)
            outcomes[settings.name] = done
            self.progress.advance("vdb", 1)
        from pipeline.report_stage import write_benchmark_report

        report = write_benchmark_report(
            self.plan, outcomes, directory / "report", self.provenance.run_dir.name
        )
        if all(o.get("status") == "succeeded" for o in outcomes.values()):
            atomic_write_json(
                directory / "manifest.json",
                {"key": self.stage.key, "files": report["files"], "databases": sorted(outcomes)},
            )
        return report

    def run_database(self, settings, db_dir: Path) -> dict[str, Any]:
        """Deploy one database, run its stages, always tear it down; return its manifest."""
        name = settings.name
        if self.cfg.cluster is not None:  # HPC: Apptainer servers as a pilot job on their own nodes
            from apps.vdb.cluster.pilot import cluster_deployment

            deployment = cluster_deployment(settings, self.plan.config, self.plan.loaded.base_dir)
        else:
            deployment = get_adapter(name).deployment(settings)
        if db_dir.exists():
            shutil.rmtree(db_dir)  # a partial earlier attempt: start clean
        db_dir.mkdir(parents=True)
        record: dict[str, Any] = {
            "database": name,
            "settings": settings.model_dump(mode="json"),
            "collection": self.spec().model_dump(),
            "started": time.time(),
        }
        try:
            endpoints = self.apps["deploy"](
                deployment, str(db_dir / "server"), self.cfg.startup_timeout_s
            ).result()
            atomic_write_json(db_dir / "endpoints.json", endpoints)
            record["server_version"] = endpoints.get("server_version", "")
            record["endpoints"] = endpoints
            record.update(self._stages(settings, endpoints, db_dir))
            record["status"] = "succeeded"
        except DatabaseError as exc:
            if name not in self.cfg.optional:
                raise
            log.warning("%s skipped (optional): %s", name, exc)
            record.update(status="skipped", reason=str(exc))
        finally:
            deployment.stop()
            record["finished"] = time.time()
            self.provenance.task_finished("vdb", {k: v for k, v in record.items() if k != "queries"})
        if record["status"] == "succeeded":
            atomic_write_json(db_dir / "manifest.json", {**record, "files": []})
        else:
            atomic_write_json(db_dir / "skipped.json", record)
        return record

    def _stages(self, settings, endpoints: dict[str, Any], db_dir: Path) -> dict[str, Any]:
        """insert (every batch size) -> searchable -> index -> query sweep, chained by futures."""
        plan, cfg, spec = self.plan, self.cfg, self.spec().model_dump()
        name, settings_dict = settings.name, settings.model_dump(mode="json")
        dataset_dir = plan.stage("embed").directory
        rows = read_manifest(dataset_dir)["rows"]
        units = insert_stage.work_units(str(dataset_dir))
        inserts = []
        searchable: Future | None = None
        for attempt, batch_size in enumerate(cfg.insert.batch_sizes):
            prepared = self.apps["prepare"](name, settings_dict, endpoints, spec, attempt > 0)
            prepared.result()  # the collection must exist before any client attaches
            tasks = [
                self.apps["insert"](
                    name,
                    settings_dict,
                    endpoints,
                    spec,
                    units[w :: cfg.insert.workers],
                    batch_size,
                    cfg.insert.clients_per_worker,
                    cfg.insert.retries,
                )
                for w in range(cfg.insert.workers)
            ]
            searchable = self.apps["searchable"](
                name, settings_dict, endpoints, spec, rows, cfg.insert.timeout_s, *tasks
            )
            parts, visible = [t.result() for t in tasks], searchable.result()
            first = min(p["first_start"] for p in parts if p["first_start"])
            last_sent = max(p["last_end"] for p in parts)
            inserts.append(
                {
                    "batch_size": batch_size,
                    "rows": rows,
                    "clients": sum(p["clients"] for p in parts),
                    "workers": cfg.insert.workers,
                    "upload_s": visible["searchable_at"] - first,
                    "send_s": last_sent - first,
                    "searchable_s": visible["searchable_at"] - last_sent,
                    "insert_vectors_per_s": rows / max(visible["searchable_at"] - first, 1e-9),
                    "retried_batches": sum(p["retried"] for p in parts),
                }
            )
        index = self.apps["index"](
            name, settings_dict, endpoints, spec, rows, cfg.index_timeout_s, searchable
        )
        queries_file = str(plan.stage("queries").directory / "queries.parquet")
        query = self.apps["query"](
            name, settings_dict, endpoints, spec, queries_file, cfg.query.model_dump(), str(db_dir), index
        )
        return {"insert": inserts, "index": index.result(), "queries": query.result()}
