"""configs/slurm-local.yaml through the real local Slurm testbed, end to end, and the faults a real
allocation meets: a database job cancelled mid-stage, a driver killed outright, a walltime that runs out.

Every run is ``python -m pipeline run`` in a subprocess, as a user would start it, with ``SLURM_CONF``
pointing at a testbed this module starts (and always stops). The runs share one workdir, so the dataset,
query and ground-truth stages run once and the fault runs (configs derived from slurm-local.yaml with other
database settings) only repeat the database stage.
"""

from __future__ import annotations

import copy
import getpass
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq
import pytest
import yaml

from apps.dataset import queries as query_set
from apps.dataset.embedding import stage as embed_stage
from apps.dataset.groundtruth import stage as groundtruth
from pipeline.config.loader import load_config
from pipeline.plan import build_plan
from tests.conftest import interruptible
from tests.slurm.conftest import SlurmTestbed

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "slurm-local.yaml"
LOCAL = REPO / "configs" / "local.yaml"
RUN_TIMEOUT = 1500


def _absolute(data: dict[str, Any], source: Path) -> dict[str, Any]:
    """A config's relative paths made absolute, so it can be written anywhere."""
    data = copy.deepcopy(data)
    data["corpus"]["paths"] = [str((source.parent / p).resolve()) for p in data["corpus"]["paths"]]
    data["queries"]["terms_file"] = str((source.parent / data["queries"]["terms_file"]).resolve())
    executables = (data.get("vdb", {}).get("cluster") or {}).get("executables", {})
    for name, path in executables.items():
        executables[name] = str((source.parent / path).resolve())
    return data


def write_config(directory: Path, name: str, workdir: Path, change: Callable[[dict], None]) -> Path:
    """slurm-local.yaml with ``workdir`` and ``change`` applied, written as ``directory/name.yaml``."""
    data = _absolute(yaml.safe_load(CONFIG.read_text()), CONFIG)
    data["workdir"] = str(workdir)
    change(data)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


STARTED: list[Run] = []


class Run:
    """``python -m pipeline run CONFIG`` in its own session, its output in a file."""

    def __init__(self, testbed: SlurmTestbed, config: Path, log: Path, env: dict[str, str] | None = None):
        STARTED.append(self)
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "run", str(config)],
            cwd=REPO,
            env={**testbed.env, **(env or {})},
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=interruptible,  # the cleanup below interrupts it like Ctrl-C
        )

    def wait(self, timeout: float = RUN_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError(f"run did not finish in {timeout}s:\n{self.output()[-3000:]}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def wait_for(what: str, condition: Callable[[], Any], run: Run, timeout: float = 600) -> Any:
    """Poll ``condition`` until truthy; fail early if the run ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if run.proc.poll() is not None:
            ended = f"the run ended ({run.proc.returncode}) before {what}"
            raise AssertionError(f"{ended}:\n{run.output()[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"no {what} after {timeout}s:\n{run.output()[-3000:]}")


class JobWatcher:
    """Samples ``squeue`` while a run goes: job name -> the node sets it ran on."""

    def __init__(self, testbed: SlurmTestbed) -> None:
        self.testbed, self.jobs = testbed, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            done = self.testbed.run("squeue", "-h", "-t", "R", "-o", "%i|%j|%N")
            for line in done.stdout.splitlines():
                job, name, nodes = line.split("|")
                self.jobs[(job, name)] = nodes

    def stop(self) -> dict[tuple[str, str], str]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.jobs


def expand(nodes: str) -> set[str]:
    """'node[1-3]' or 'node2' -> {'node1', 'node2', 'node3'}."""
    if "[" not in nodes:
        return {n for n in nodes.split(",") if n}
    prefix, ranges = nodes.split("[")
    found = set()
    for part in ranges.rstrip("]").split(","):
        first, _, last = part.partition("-")
        found.update(f"{prefix}{i}" for i in range(int(first), int(last or first) + 1))
    return found


def vdb_dirs(workdir: Path, database: str) -> list[Path]:
    return sorted((workdir / "store" / "vdb").glob(f"*/{database}"))


def run_processes(run_id: str, names: tuple[str, ...]) -> list[str]:
    """Live processes of run ``run_id`` (by its environment) whose command names one of ``names``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.info["cmdline"] or [])
            if any(n in cmd for n in names) and proc.environ().get("PES2O_RUN_ID") == run_id:
                found.append(f"{proc.pid} {cmd[:150]}")
        except (psutil.Error, OSError):
            continue
    return found


def server_processes(data_root: str) -> list[str]:
    """Live weaviate/milvus servers started by a testbed rank (their environment names the testbed)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            server = "weaviate-server" in cmd or "milvus" in cmd
            if server and proc.info["status"] != psutil.STATUS_ZOMBIE:
                environ = " ".join(f"{k}={v}" for k, v in proc.environ().items())
                if data_root in environ + cmd:
                    found.append(f"{proc.pid} {cmd[:150]}")
        except (psutil.Error, OSError):
            continue
    return found


def _started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def run_id_of(run: Run) -> str:
    for line in run.output().splitlines():
        if line.startswith("run "):
            return line.split()[1]
    raise AssertionError(f"no run id in the output:\n{run.output()[:2000]}")


@pytest.fixture(autouse=True)
def no_run_outlives_its_test(testbed: SlurmTestbed) -> Iterator[None]:
    """A run still going when its test ends (the test failed) is interrupted like Ctrl-C, so it tears down
    its own jobs; then killed; then whatever is still queued is cancelled."""
    yield
    for run in STARTED:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGINT)
            try:
                run.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(run.proc.pid, signal.SIGKILL)
                run.proc.wait(timeout=10)
    STARTED.clear()
    testbed.run("scancel", "--user", getpass.getuser())


def new_files(pattern: Callable[[], list[Path]], before: set[Path]) -> Callable[[], list[Path]]:
    """A condition: files of ``pattern`` that were not there ``before`` (the tests share one store)."""
    return lambda: [p for p in pattern() if p not in before]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("slurm-local")
    yield path


@pytest.fixture(scope="module")
def shm_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 'memory' medium of the fault runs: a private directory, so leftovers are easy to see."""
    return tmp_path_factory.mktemp("shm")


# --- end to end --------------------------------------------------------------------------------------------


def test_slurm_local_runs_end_to_end_through_the_scheduler(
    testbed: SlurmTestbed,
    workdir: Path,
    tmp_path: Path,
) -> None:
    watcher = JobWatcher(testbed)
    run = Run(testbed, CONFIG, tmp_path / "run.log", {"PIPELINE_WORKDIR": str(workdir)})
    started = time.monotonic()
    code = run.wait()
    jobs = watcher.stop()
    print(f"configs/slurm-local.yaml through the testbed: {time.monotonic() - started:.0f} s")
    assert code == 0, run.output()[-4000:]

    # Every database benchmarked and reported.
    (vdb,) = (workdir / "store" / "vdb").iterdir()
    report = (vdb / "report" / "report.md").read_text()
    for name in ("qdrant", "milvus", "weaviate"):
        assert (vdb / name / "manifest.json").is_file(), name
        assert f"| {name} |" in report
    # Weaviate ran as a 2-node pilot job, one rank per node; its clients on another node.
    registry = vdb / "weaviate" / "server" / "cluster" / "registry"
    ranks = [yaml.safe_load(p.read_text()) for p in sorted(registry.glob("rank-*.json"))]
    assert len(ranks) == 2 and len({r["node"] for r in ranks}) == 2, ranks
    by_name = {name: expand(nodes) for (_, name), nodes in jobs.items()}
    weaviate_nodes = next(n for name, n in by_name.items() if name.startswith("pes2o-vdb.weaviate"))
    client_nodes = next(n for name, n in by_name.items() if name.startswith("parsl.cpu"))
    assert weaviate_nodes == {r["node"] for r in ranks}
    assert not weaviate_nodes & client_nodes, jobs
    assert any(name.startswith("pes2o-vdb.milvus") for name in by_name), jobs
    # Nothing of the run is left: no job in the queue, no server.
    testbed.assert_queue_drains()
    assert not server_processes(str(vdb)), server_processes(str(vdb))


def test_the_dataset_and_ground_truth_equal_those_of_the_local_config(
    testbed: SlurmTestbed,
    workdir: Path,
    tmp_path: Path,
) -> None:
    """configs/local.yaml (without its databases) plans the very content keys the Slurm run made, and its
    stages run here, outside Slurm and Parsl, give the same bytes: the first and last dataset parts
    re-embedded (with a fresh OpenVINO export, not the Slurm workers'), the queries re-embedded, the ground
    truth recomputed. (Re-running all of local.yaml took three minutes of CI for the same evidence.)"""
    data = _absolute(yaml.safe_load(LOCAL.read_text()), LOCAL)
    data["workdir"] = str(workdir)  # the Slurm run's store: equal keys name the same directories
    data.pop("vdb")
    data["embedding"]["export_dir"] = str(tmp_path / "export")  # not part of any key
    config = tmp_path / "local.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    plan = build_plan(load_config(config))
    cfg = plan.loaded.config
    for stage in ("shard", "chunk", "embed", "queries", "groundtruth"):
        assert plan.stage(stage).complete, f"local.yaml's {stage} key is not the Slurm run's"

    embed, chunks = plan.stage("embed"), plan.stage("chunk")
    manifest = json.loads((embed.directory / "manifest.json").read_text())
    assert cfg.dataset.expected_rows == manifest["rows"]  # local.yaml's resource plan N is the real count
    parts = manifest["files"]
    assert len(parts) > 1
    for part in (parts[0], parts[-1]):
        embed_stage.embed_shard(
            str(chunks.directory / part["input"]),
            part["shard"],
            str(tmp_path / "dataset"),
            plan.embedding,
            plan.file_metadata,
            cfg.dataset.holdout_fraction,
            cfg.dataset.row_group_rows,
        )
        ours = pq.read_table(tmp_path / "dataset" / part["file"])
        assert ours.equals(pq.read_table(embed.directory / part["file"])), part["file"]

    queries = plan.stage("queries")
    chunk_files = sorted(str(p) for p in chunks.directory.glob("chunks-*.parquet"))
    query_set.build_queries(
        str(tmp_path / "queries"),
        cfg.queries,
        plan.embedding,
        str(plan.terms_file),
        chunk_files,
        cfg.dataset.holdout_fraction,
    )
    assert pq.read_table(tmp_path / "queries" / "queries.parquet").equals(
        pq.read_table(queries.directory / "queries.parquet")
    )
    gt = plan.stage("groundtruth")
    groundtruth.compute_groundtruth(
        str(tmp_path / "groundtruth"),
        str(embed.directory),
        str(queries.directory / "queries.parquet"),
        cfg.groundtruth,
    )
    assert pq.read_table(tmp_path / "groundtruth" / "groundtruth.parquet").equals(
        pq.read_table(gt.directory / "groundtruth.parquet")
    )


# --- faults through the real scheduler ---------------------------------------------------------------------


def weaviate_only(shm: Path, **query: Any) -> Callable[[dict], None]:
    """Only Weaviate (the 2-node pilot), its data under ``shm``, and ``query`` changes (a new vdb key)."""

    def change(data: dict) -> None:
        data["vdb"]["databases"] = [{"name": "weaviate"}]
        data["vdb"]["cluster"]["storage"]["memory_path"] = str(shm)
        data["vdb"]["cluster"].pop("overrides", None)
        data["vdb"]["query"].update(query)

    return change


def test_a_cancelled_database_job_fails_the_stage_with_its_name(
    testbed: SlurmTestbed,
    workdir: Path,
    shm_root: Path,
    tmp_path: Path,
) -> None:
    shm = shm_root / "cancelled"
    shm.mkdir()
    # Enough query settings that the stage is still running when the job is cancelled.
    change = weaviate_only(shm, ef=[16, 24, 32, 48, 64, 96, 128], batch_size=[1, 8], clients=[1, 2])

    def raw_files() -> list[Path]:
        return [p for d in vdb_dirs(workdir, "weaviate") for p in (d / "raw").glob("*.parquet")]

    before = set(raw_files())
    run = Run(testbed, write_config(tmp_path, "cancel", workdir, change), tmp_path / "run.log")
    raw = wait_for("query results", new_files(raw_files, before), run)
    db_dir = raw[0].parent.parent
    queue = testbed.ok("squeue", "-h", "-o", "%i %j")
    pilot = [line.split()[0] for line in queue.splitlines() if "pes2o-vdb.weaviate" in line]
    assert pilot, queue
    testbed.ok("scancel", pilot[0])
    code = run.wait()
    out = run.output()
    assert code != 0, out[-3000:]
    assert f"database job {pilot[0]}" in out and "weaviate" in out, out[-3000:]
    assert "Traceback" not in out
    assert not (db_dir / "manifest.json").exists()  # nothing marked complete
    assert not (db_dir.parent / "manifest.json").exists()
    deadline = time.monotonic() + 60
    while server_processes(str(shm)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not server_processes(str(shm)), server_processes(str(shm))  # no rank left running
    testbed.assert_queue_drains()


def test_one_allocation_runs_drivers_clients_and_databases_inside_one_job(
    testbed: SlurmTestbed,
    workdir: Path,
    shm_root: Path,
    tmp_path: Path,
) -> None:
    """executor.allocation: one (a queue that runs one job per user): `run` submits one 4-node job whose
    first node runs the driver; the GPU block, the client block and the 2-node Weaviate pilot each start
    inside it on their own nodes, and nothing else reaches the queue."""
    shm = shm_root / "one-allocation"
    shm.mkdir()

    def change(data: dict) -> None:
        weaviate_only(shm, ef=[40])(data)  # a new point: the dataset stages are the module's
        data["executor"]["allocation"] = "one"

    before = set(vdb_dirs(workdir, "weaviate"))
    watcher = JobWatcher(testbed)
    run = Run(testbed, write_config(tmp_path, "one", workdir, change), tmp_path / "run.log")
    code = run.wait()
    jobs = watcher.stop()
    out = run.output()
    assert code == 0, out[-4000:]
    assert "submitted the run as one job" in out and "ended (COMPLETED)" in out, out[-3000:]
    assert len(jobs) == 1 and next(iter(jobs))[1].startswith("pes2o-run."), jobs  # no other job submitted
    (job_nodes,) = (sorted(expand(nodes)) for nodes in jobs.values())
    assert len(job_nodes) == 4
    (db_dir,) = (d for d in vdb_dirs(workdir, "weaviate") if d not in before)
    assert (db_dir / "manifest.json").is_file()
    registry = db_dir / "server" / "cluster" / "registry"
    ranks = [yaml.safe_load(p.read_text()) for p in sorted(registry.glob("rank-*.json"))]
    # the job's nodes in order: GPU block, client block, then the databases'
    assert sorted(r["node"] for r in ranks) == job_nodes[2:], (ranks, job_nodes)
    testbed.assert_queue_drains()
    assert not server_processes(str(shm)), server_processes(str(shm))


def ranks_in(workdir: Path, state: str, skip: frozenset[Path] = frozenset()) -> list[dict]:
    """Registry entries of the Weaviate pilots under ``workdir`` (but those in ``skip``) in ``state``."""
    entries = []
    for d in vdb_dirs(workdir, "weaviate"):
        if d in skip:
            continue
        for path in (d / "server" / "cluster" / "registry").glob("rank-*.json"):
            try:
                entry = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError):
                continue
            if entry and entry.get("state") == state:
                entries.append(entry)
    return entries


def test_a_killed_driver_leaves_nothing_running_for_long(
    testbed: SlurmTestbed,
    workdir: Path,
    shm_root: Path,
    tmp_path: Path,
) -> None:
    """kill -9 of the driver mid-stage: the ranks stop once its lease is stale; the next run cancels the
    old run's batch jobs (the worker blocks too) and succeeds on fresh data directories."""
    shm = shm_root / "killed"
    shm.mkdir()

    def change(data: dict) -> None:
        weaviate_only(shm, ef=[16, 24, 32, 48, 64, 96, 128], batch_size=[1, 8], clients=[1, 2])(data)
        data["vdb"]["cluster"]["driver_lease_s"] = 15

    config = write_config(tmp_path, "killed", workdir, change)
    earlier = frozenset(vdb_dirs(workdir, "weaviate"))  # of the tests before: not this one's
    first = Run(testbed, config, tmp_path / "first.log")
    wait_for("two ready ranks", lambda: len(ranks_in(workdir, "ready", earlier)) == 2, first)
    old_run = run_id_of(first)
    old_data = sorted(p for p in shm.rglob("rank-*") if p.is_dir())
    assert old_data, "the ranks keep their data under the configured memory path"
    # The interchanges rename themselves, hiding the run id in their environment: find them as children.
    interchanges = [
        (c.pid, c.create_time())
        for c in psutil.Process(first.proc.pid).children(recursive=True)
        if "interchange" in " ".join(c.cmdline())
    ]
    assert interchanges, "the driver should have started Parsl interchanges"
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=30)

    # Without a driver renewing the lease, both ranks stop on their own (and remove their data).
    deadline = time.monotonic() + 90
    while len(ranks_in(workdir, "orphaned", earlier)) < 2 and time.monotonic() < deadline:
        time.sleep(1)
    assert len(ranks_in(workdir, "orphaned", earlier)) == 2, first.output()[-2000:]
    assert not server_processes(str(shm)), server_processes(str(shm))
    assert not [p for p in old_data if p.exists()], "an orphaned rank left its data behind"
    # The old run's worker blocks still hold their nodes: nothing in the testbed stops them but us.
    assert run_processes(old_run, ("process_worker_pool",)), "expected the old worker pools still running"

    # The next run in the workdir, with one query setting (the cleanup does not depend on the config; the
    # sweep only had to outlast the kill).
    def small(data: dict) -> None:
        change(data)
        data["vdb"]["query"].update(ef=[32], batch_size=[8], clients=[1])

    second = Run(testbed, write_config(tmp_path, "after-kill", workdir, small), tmp_path / "second.log")
    code = second.wait()
    assert code == 0, second.output()[-4000:]
    assert "cancelled" in second.output(), second.output()[:3000]  # it says what it stopped
    assert not run_processes(old_run, ("process_worker_pool", "interchange", "weaviate-server"))
    alive = [pid for pid, started in interchanges if psutil.pid_exists(pid) and _started(pid) == started]
    assert not alive, f"interchanges of the killed run still running: {alive}"
    testbed.assert_queue_drains()
    assert len(ranks_in(workdir, "stopped", earlier)) == 2  # the second run's ranks, stopped on purpose


def test_a_database_job_past_its_walltime_fails_with_a_clear_error(
    testbed: SlurmTestbed,
    workdir: Path,
    shm_root: Path,
    tmp_path: Path,
) -> None:
    shm = shm_root / "walltime"
    shm.mkdir()

    def change(data: dict) -> None:
        # One rank, a one-minute job; stage timeouts that fit in it (the plan checks they do); a query
        # sweep far longer than the minute, so the scheduler ends the job in the middle of it.
        # (128 settings of 500 queries and 200 warm-up queries each: several minutes of work here.)
        efs = [16, 24, 32, 48, 64, 96, 128, 192]
        sweep = {"batch_size": [1, 2], "clients": [1, 2], "k": [10, 20, 50, 100], "warmup_queries": 200}
        weaviate_only(shm, ef=efs, **sweep)(data)
        data["vdb"]["collection"]["shards"] = 1
        data["vdb"]["cluster"].update(
            {"nodes": 1, "workers": 1, "walltime": "00:01:00", "startup_timeout_s": 15}
        )
        data["vdb"]["insert"]["timeout_s"] = 20
        data["vdb"]["index_timeout_s"] = 20

    run = Run(testbed, write_config(tmp_path, "walltime", workdir, change), tmp_path / "run.log")
    started = time.monotonic()
    code = run.wait()
    print(f"walltime run ended after {time.monotonic() - started:.0f} s")
    out = run.output()
    assert code != 0, out[-3000:]
    assert "TIMEOUT" in out and "weaviate" in out and "database job" in out, out[-3000:]
    assert "Traceback" not in out
    for d in vdb_dirs(workdir, "weaviate"):
        assert not (d.parent / "manifest.json").exists() or (d / "manifest.json").exists()
    assert not server_processes(str(shm)), server_processes(str(shm))
    testbed.assert_queue_drains()
