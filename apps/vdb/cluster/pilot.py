"""A database cluster as a pilot job: submit the rendered scripts, wait for every rank, publish endpoints.

:class:`ClusterDeployment` submits the job command with a Parsl provider (PBS Pro, Slurm, or local), reads
the endpoint registry (``registry/rank-NNN.json``, rank -> host and ports, written by each rank on the
shared file system), waits until every rank is healthy, returns :class:`Endpoints`, and on ``stop`` asks
every rank to stop (``registry/STOP``) before cancelling the job.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any

from apps.vdb.base import DatabaseError, Deployment, Endpoint, Endpoints
from apps.vdb.cluster.config import DatabaseClusterConfig
from apps.vdb.cluster.layout import LEASE_FILE, STOP_FILE, ClusterLayout, node_shape, plan_cluster
from apps.vdb.cluster.provider import cluster_provider
from apps.vdb.cluster.render import launcher_command, write_files
from apps.vdb.process import tail
from core.lifetime import record_job
from executors.providers import cancel_command, describe_job, job_ended, rerunnable


def read_registry(registry: Path) -> dict[int, dict[str, Any]]:
    """rank -> latest entry written by that rank (half-written files never appear: writes are renames)."""
    entries: dict[int, dict[str, Any]] = {}
    for path in sorted(registry.glob("rank-*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        entries[int(entry["rank"])] = entry
    return entries


def endpoints_from_registry(layout: ClusterLayout, entries: dict[int, dict[str, Any]]) -> Endpoints:
    """Endpoints for the clients: the entry ranks, preferred first, with their registered addresses."""
    nodes = []
    by_rank = {r.rank: r for r in layout.ranks}
    for rank in layout.entry_ranks:
        spec, entry = by_rank[rank], entries[rank]
        host, ports = entry["host"], entry["ports"]
        port = int(ports[spec.client_port])
        extra: dict[str, str | int] = {"role": spec.role, "url": f"http://{host}:{port}"}
        if "metrics" in ports:
            extra["metrics_port"] = int(ports["metrics"])
        for key, rel in spec.client_files.items():  # e.g. pgvector's password file, written by the rank
            extra[key] = str(layout.directory / "ranks" / f"{rank:03d}" / rel)
        nodes.append(Endpoint(rank=rank, host=host, port=port, grpc_port=ports.get("grpc"), extra=extra))
    logs = [str(layout.directory / "logs" / f"rank-{r.rank:03d}.log") for r in layout.ranks]
    return Endpoints(
        database=layout.database,
        nodes=nodes,
        data_dir=layout.shared_data or "",
        server_version=f"{layout.database} ({_image_name(layout.ranks[0].image) if layout.ranks else '?'})",
        log_paths=logs,
    )


def _image_name(image: str) -> str:
    """An image or executable path as its file name; a description (Milvus native) as it is."""
    return Path(image).name if image.startswith("/") else image


class DriverLease:
    """A driver thread that renews ``path`` (its mtime) while the deployment lives; the ranks stop when it
    is older than ``lease_s`` (lib.sh ``vdb_orphaned``). ``lease_s`` 0: no lease at all."""

    def __init__(self, path: Path, lease_s: float) -> None:
        self.path, self.lease_s = path, lease_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if lease_s > 0:
            self.renew()
            self._thread = threading.Thread(target=self._loop, name=f"lease {path}", daemon=True)
            self._thread.start()

    def renew(self) -> None:
        """Touch the lease file now."""
        with contextlib.suppress(OSError):  # a transient file-system error: the next renewal retries
            self.path.touch()

    def _loop(self) -> None:
        while not self._stop.wait(max(1.0, self.lease_s / 6)):
            self.renew()

    def stop(self) -> None:
        """Stop renewing (the ranks are being stopped on purpose, or never started)."""
        self._stop.set()


class ClusterDeployment(Deployment):
    """Runs one database as a batch job of Apptainer ranks; ``stop`` ends every rank and the job."""

    def __init__(
        self,
        settings: Any,
        cluster: DatabaseClusterConfig,
        executor: Any,
        base_dir: Path | None = None,
        provider: Any = None,
        poll_s: float = 5.0,
        queue_timeout_s: float | None = None,
    ) -> None:
        # This database's view of the block (its overrides applied).
        self.settings, self.cluster, self.executor = settings, cluster.for_database(settings.name), executor
        self.name = settings.name
        self.base_dir = base_dir
        self.provider = provider
        self.poll_s = poll_s
        self.queue_timeout_s = queue_timeout_s
        self.layout: ClusterLayout | None = None
        self.job_id: str | None = None
        self._lease: DriverLease | None = None

    def plan(self, workdir: Path) -> ClusterLayout:
        """The layout this deployment would start under ``workdir`` (no side effects)."""
        rerun = rerunnable(self.executor, self.cluster.queue)
        return plan_cluster(
            self.settings, self.cluster, node_shape(self.executor), Path(workdir), self.base_dir, rerun
        )

    def start(self, workdir: Path, timeout: float = 120.0) -> Endpoints:
        """Submit the job, wait for it to run and for every rank to be healthy; return the endpoints.

        Time in the queue is not counted against ``timeout`` (unless ``queue_timeout_s`` is set).
        """
        workdir = Path(workdir).resolve()
        self.layout = layout = self.plan(workdir)
        write_files(layout, self.cluster)
        hosts = self._allocation_hosts()
        provider = self.provider or cluster_provider(self.executor, self.cluster, hosts, layout.directory)
        self.provider = provider
        provider.script_dir = str(layout.directory / "jobs")
        Path(provider.script_dir).mkdir(parents=True, exist_ok=True)
        command = launcher_command(layout, self.cluster, node_shape(self.executor), hosts)
        self._lease = DriverLease(layout.registry / LEASE_FILE, self.cluster.driver_lease_s)
        self.job_id = provider.submit(command, 1, f"pes2o-vdb.{layout.cluster_id}")
        if not self.job_id:
            self._lease.stop()
            raise DatabaseError(f"{self.name}: the scheduler did not accept the database job")
        cancel = cancel_command(provider)
        if cancel:  # a driver killed outright cannot cancel it: the next run in this workdir does
            record_job(f"{self.name} database pilot", str(self.job_id), cancel)
        health_limit = max(timeout, self.cluster.startup_timeout_s)
        queued_since, running_since = time.monotonic(), None
        # The registry is a file read; the scheduler is asked only at its provider's polling interval.
        status_every = float(getattr(provider, "status_polling_interval", 30) or 30)
        status, status_at = None, -float("inf")
        try:
            while True:
                entries = read_registry(layout.registry)
                failed = [e for e in entries.values() if e.get("state") == "failed"]
                if failed:
                    raise DatabaseError(self._failure(f"rank {failed[0]['rank']} failed to start", failed[0]))
                if len(entries) == len(layout.ranks) and all(
                    e.get("state") == "ready" for e in entries.values()
                ):
                    return endpoints_from_registry(layout, entries)
                now = time.monotonic()
                if status is None or now - status_at >= status_every:
                    status, status_at = provider.status([self.job_id])[0], now
                if status.terminal:
                    state = describe_job(provider, str(self.job_id)) or status.state.name
                    raise DatabaseError(self._failure(f"database job {self.job_id} ended ({state})"))
                if running_since is None and (entries or status.state.name == "RUNNING"):
                    running_since = now
                if (
                    running_since is None
                    and self.queue_timeout_s
                    and now - queued_since > self.queue_timeout_s
                ):
                    raise DatabaseError(
                        f"{self.name}: database job still queued after {self.queue_timeout_s:.0f}s"
                    )
                if running_since is not None and now - running_since > health_limit:
                    missing = sorted(
                        set(range(len(layout.ranks)))
                        - {r for r, e in entries.items() if e.get("state") == "ready"}
                    )
                    raise DatabaseError(
                        self._failure(f"ranks {missing} not healthy after {health_limit:.0f}s")
                    )
                time.sleep(self.poll_s)
        except BaseException:
            self.stop()
            raise

    def _allocation_hosts(self) -> list[str] | None:
        """The database nodes of the run's own job under ``executor.allocation: one``, else None."""
        from executors.allocation import current_split, in_one_allocation

        if not in_one_allocation(self.executor):
            return None

        hosts = current_split(self.executor, None).databases
        if len(hosts) < self.cluster.nodes:
            raise DatabaseError(
                f"{self.name}: the allocation leaves {len(hosts)} node(s) for the databases, "
                f"vdb.cluster.nodes asks {self.cluster.nodes}"
            )
        return hosts

    def lost(self, settle_s: float = 30.0) -> str | None:
        """Why the running cluster is gone (its job ended, a rank stopped), or None while it serves.

        Asked after a stage failed, so the error names the job and the database rather than a refused
        connection. A server can die seconds before its job's state or its rank's registry entry says
        so (the ranks are still stopping on the scheduler's SIGTERM): both are watched for ``settle_s``.
        """
        if self.layout is None or self.job_id is None:
            return None
        job = str(self.job_id)
        deadline = time.monotonic() + settle_s
        while True:
            ended = describe_job(self.provider, job)  # the scheduler's own word: CANCELLED, TIMEOUT, ...
            if ended is not None and job_ended(ended):
                return self._failure(f"database job {job} ended ({ended}) during the stage")
            if ended is None:  # no such command here: Parsl's view (squeue calls a vanished job COMPLETED)
                with contextlib.suppress(Exception):
                    status = self.provider.status([job])[0]
                    if status.terminal:
                        ended = status.state.name
                        return self._failure(f"database job {job} ended ({ended}) during the stage")
            entries = read_registry(self.layout.registry)
            gone = [e for e in entries.values() if e.get("state") in ("failed", "orphaned", "stopped")]
            if time.monotonic() >= deadline:
                if gone:
                    # The scheduler has not said (yet: a loaded controller can take longer than the settle
                    # time); the ranks have. Name the job either way.
                    rank = gone[0]
                    return self._failure(f"database job {job}: rank {rank['rank']} is {rank['state']}", rank)
                return None
            time.sleep(2.0)

    def _failure(self, what: str, entry: dict[str, Any] | None = None) -> str:
        """An error message with the tail of the failing rank's log (or of the job's output)."""
        assert self.layout is not None
        logs = []
        if entry is not None:
            logs.append(
                Path(entry.get("log") or self.layout.directory / "logs" / f"rank-{entry['rank']:03d}.log")
            )
        logs += sorted((self.layout.directory / "jobs").glob("*.std*"))
        shown = "\n".join(f"--- {p}\n{tail(p, 20)}" for p in logs if p.exists())
        return f"{self.name} cluster: {what}\n{shown}".rstrip()

    def telemetry_files(self) -> list[Path]:
        """The Parquet files the ranks' samplers wrote (``telemetry/rank-NNN.parquet``; after ``stop``).

        A rank writes its file before it registers ``stopped``, so after a clean ``stop`` every sampled
        rank's file is complete; a rank killed outright (job cancelled) may have none.
        """
        if self.layout is None or not self.cluster.telemetry:
            return []
        return sorted((self.layout.directory / "telemetry").glob("rank-*.parquet"))

    def stop(self, grace: float = 60.0) -> None:
        """Ask every rank to stop (flushing data), wait up to ``grace`` s, then cancel the job. Idempotent."""
        if self.layout is None or self.job_id is None:
            return
        layout, job_id = self.layout, self.job_id
        self.job_id = None
        if self._lease is not None:
            self._lease.stop()
        (layout.registry / STOP_FILE).touch()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            entries = read_registry(layout.registry)
            if all(e.get("state") in ("stopped", "failed", "orphaned") for e in entries.values()):
                break
            time.sleep(min(self.poll_s, 2.0))
        with contextlib.suppress(Exception):  # the job may be gone already; teardown must not raise
            self.provider.cancel([job_id])


def cluster_deployment(settings: Any, run_config: Any, base_dir: Path | None = None) -> ClusterDeployment:
    """The deployment for ``settings`` when ``run_config.vdb.cluster`` is set (the VDB stage's deploy)."""
    return ClusterDeployment(settings, run_config.vdb.cluster, run_config.executor, base_dir)
