"""Rendered HPC artifacts: golden job scripts and server commands, structural checks, the pilot locally.

Regenerate the golden files after an intended change with::

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/pipeline/test_hpc_render.py -k golden

then review ``git diff tests/golden``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq
import pytest

from apps.telemetry.collector import DatabaseTelemetry
from apps.vdb.cluster.layout import ClusterLayout, node_shape, plan_cluster
from apps.vdb.cluster.pilot import ClusterDeployment, read_registry
from apps.vdb.cluster.render import launcher_command, render_files
from core.errors import ConfigError
from pipeline.config.loader import load_config
from pipeline.hpc_plan import render_artifacts, render_plan
from tests.conftest import REPO, TERMS

GOLDEN = REPO / "tests" / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
VENV_BIN = str(Path(sys.executable).parent)

# Fixed, machine-independent values: rendering never touches these paths.
FIXED_ENV = {
    "ACCOUNT": "MyProject",
    "PROJECT_DIR": "/projects/MyProject",
    "PES2O_CORPUS": "/projects/MyProject/peS2o",
    "MODEL_DIR": "/projects/MyProject/models",
    "VENV": "/projects/MyProject/venv",
    "IMAGES": "/projects/MyProject/images",
    "PES2O_TERMS": str(TERMS),
    "DAOS_POOL": "MyPool",
    "DAOS_CONT": "vdb",
    "PARTITION": "gpu",
    "GIST_DIR": "/projects/MyProject/gist",
    "DBPEDIA_OPENAI_HDF5": "/projects/MyProject/dbpedia-openai-1000k-angular.hdf5",
    "YANDEX_T2I_DIR": "/projects/MyProject/yandex-t2i",
}


@pytest.fixture
def fixed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in FIXED_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("QUEUE", raising=False)


def artifacts(platform: str) -> dict[str, str]:
    loaded = load_config(REPO / "configs" / f"{platform}.yaml")
    # This interpreter's venv appears in worker_init; golden files name it neutrally.
    return {name: text.replace(VENV_BIN, "<venv>/bin") for name, text in render_artifacts(loaded).items()}


# --- golden files ------------------------------------------------------------------------------------------


def study_point(name: str) -> bool:
    """An artifact of one of the study's swept entries (its directory is a swept label: ``fig4-...[...]``)."""
    return "[" in name.split("/")[0]


@pytest.mark.parametrize("platform", ["polaris", "aurora"])
def test_golden_artifacts(fixed_env: None, platform: str) -> None:
    # The study's sweeps render dozens of job shapes from the same templates; the golden files hold the
    # main deployment, and test_study_sweeps_render_a_job_per_shape checks the rest.
    rendered = {name: text for name, text in artifacts(platform).items() if not study_point(name)}
    root = GOLDEN / platform
    if UPDATE:
        for old in root.rglob("*") if root.exists() else []:
            if old.is_file():
                old.unlink()
        for name, text in rendered.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
    stored = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}
    assert sorted(stored) == sorted(rendered), "artifacts added or removed: UPDATE_GOLDEN=1 (see module doc)"
    for name, text in rendered.items():
        assert text == stored[name], f"{platform}/{name} differs from its golden file (UPDATE_GOLDEN=1)"


@pytest.mark.parametrize(("platform", "shapes"), [("polaris", 25), ("aurora", 38)])
def test_study_sweeps_render_a_job_per_shape(fixed_env: None, platform: str, shapes: int) -> None:
    """configs/<platform>.yaml holds the study's sweeps (000 §V): one database job per deployment shape."""
    from pipeline.hpc_plan import pilot_shapes

    loaded = load_config(REPO / "configs" / f"{platform}.yaml")
    rendered = artifacts(platform)
    jobs = [name for name in rendered if study_point(name) and name.endswith("/job.sh")]
    assert len(jobs) == shapes == len(pilot_shapes(loaded.config.vdb)) - 3  # the main three apart
    nodes = {
        name.split("/")[0]: int(re.search(r"select=(\d+)", rendered[name]).group(1))  # type: ignore[union-attr]
        for name in jobs
    }
    assert nodes[
        "fig4-workers-qdrant[shards=32,workers=32,nodes=8]"
        if platform == "polaris"
        else "fig7-nodes-weaviate[shards=64,nodes=16,workers=64]"  # capacity's largest (16 nodes)
    ] == (8 if platform == "polaris" else 16)
    assert all(n >= 1 for n in nodes.values())


def test_job_scripts_come_from_the_parsl_templates(fixed_env: None) -> None:
    polaris = artifacts("polaris")
    gpu = polaris["job-workers.sh"]
    assert gpu.startswith("# submit: qsub  -q prod -A MyProject ")
    assert "#PBS -l select=16:ncpus=64:ngpus=4" in gpu and "#PBS -l walltime=03:00:00" in gpu
    assert "#PBS -l filesystems=home:eagle" in gpu and "#PBS -l place=scatter" in gpu
    assert "mpiexec --cpu-bind none --depth=64 --ppn 1 -n $WORKERCOUNT" in gpu
    assert "--available-accelerators 0 1 2 3" in gpu
    # ALCF's Parsl page: GPU 0's worker on cores 24-31 (+ 56-63), GPU 3's on 0-7
    assert "--cpu-affinity list:24-31,56-63:16-23,48-55:8-15,40-47:0-7,32-39" in gpu
    assert "source /projects/MyProject/venv/bin/activate" in gpu
    assert "TMPDIR" not in gpu  # a 16-node block; only one-node blocks need ALCF's TMPDIR=/tmp
    aurora = artifacts("aurora")
    tiles = aurora["job-workers.sh"]
    assert "--available-accelerators 0.0 0.1 1.0 1.1 2.0 2.1 3.0 3.1 4.0 4.1 5.0 5.1" in tiles
    # tile ids need the composite hierarchy, set after the frameworks module that sets FLAT
    init = tiles[tiles.index("module load frameworks") :]
    assert "export ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE" in init
    assert "ZE_FLAT_DEVICE_HIERARCHY" not in aurora["job-cpu.sh"]
    assert "#PBS -l filesystems=home:flare" in tiles and "--ppn 1" in tiles
    milvus = aurora["milvus/job.sh"]  # Milvus on DAOS: the DAOS file system and the dfuse mount
    assert "#PBS -l filesystems=home:flare:daos_user_fs" in milvus
    assert "launch-dfuse.sh MyPool:vdb" in milvus


def test_one_node_blocks_get_tmpdir_and_preemptable_jobs_are_rerunnable(fixed_env: None) -> None:
    """ALCF's Parsl pages: ``export TMPDIR=/tmp`` for one-node blocks (AF_UNIX path too long); the
    Polaris queue page: ``#PBS -r y`` makes a preemptable job rerun, and its data directory must not
    name the job (the rerun keeps its id only on PBS's say-so)."""
    from apps.vdb.cluster.provider import cluster_provider
    from executors.platforms import parsl_config_for
    from pipeline.hpc_plan import submit_script

    loaded = load_config(REPO / "configs" / "polaris.yaml")
    cfg = loaded.config
    one_node = cfg.executor.model_copy(
        update={"gpu": cfg.executor.gpu.model_copy(update={"nodes_per_block": 1, "queue": "preemptable"})}
    )
    config = parsl_config_for(one_node, Path("/work/run"), address="127.0.0.1")
    gpu = next(ex for ex in config.executors if ex.label == "workers")
    assert "export TMPDIR=/tmp" in gpu.provider.worker_init
    assert "#PBS -r y" in gpu.provider.scheduler_options
    cpu = next(ex for ex in config.executors if ex.label == "cpu")  # 10 nodes in prod
    assert "TMPDIR" not in cpu.provider.worker_init and "-r y" not in cpu.provider.scheduler_options

    cluster = cfg.vdb.cluster.model_copy(update={"queue": "preemptable", "nodes": 1, "workers": 4})
    script, _ = submit_script(cluster_provider(cfg.executor, cluster), "true", "db", "/work/jobs")
    assert "#PBS -r y" in script
    qdrant = next(s for s in cfg.vdb.databases if s.name == "qdrant")
    node = node_shape(cfg.executor)
    kept = plan_cluster(qdrant, cluster, node, Path("/work/vdb"), loaded.base_dir, rerunnable=True)
    per_job = plan_cluster(qdrant, cluster, node, Path("/work/vdb"), loaded.base_dir)
    assert all("VDB_JOB" not in r.data_dir and "/rerunnable/" in r.data_dir for r in kept.ranks)
    assert all("job-${VDB_JOB}" in r.data_dir for r in per_job.ranks)


def test_containers_run_with_fakeroot_where_the_site_needs_it(fixed_env: None) -> None:
    """ALCF's container pages: --fakeroot on Polaris and Aurora compute nodes; a config may turn it off."""
    for platform in ("polaris", "aurora"):
        loaded = load_config(REPO / "configs" / f"{platform}.yaml")
        cfg = loaded.config
        qdrant = next(s for s in cfg.vdb.databases if s.name == "qdrant")
        node = node_shape(cfg.executor)
        layout = plan_cluster(qdrant, cfg.vdb.cluster, node, Path("/work/vdb"), loaded.base_dir)
        scripts = render_files(layout, cfg.vdb.cluster)
        assert "apptainer exec --cleanenv \\\n  --fakeroot" in scripts["ranks/rank-000.sh"], platform
        off = cfg.vdb.cluster.model_copy(update={"fakeroot": False})
        layout = plan_cluster(qdrant, off, node, Path("/work/vdb"), loaded.base_dir)
        assert "--fakeroot" not in render_files(layout, off)["ranks/rank-000.sh"]
    slurm = load_config(REPO / "configs" / "slurm.yaml")  # a generic site: no default
    qdrant = next(s for s in slurm.config.vdb.databases if s.name == "qdrant")
    node = node_shape(slurm.config.executor)
    layout = plan_cluster(qdrant, slurm.config.vdb.cluster, node, Path("/work/vdb"), slurm.base_dir)
    assert "--fakeroot" not in render_files(layout, slurm.config.vdb.cluster)["ranks/rank-000.sh"]


def test_plan_text_has_every_section(fixed_env: None) -> None:
    text = render_plan(load_config(REPO / "configs" / "polaris.yaml"), check=False)
    for heading in (
        "parsl-config.txt",
        "job-workers.sh",
        "job-cpu.sh",
        "qdrant/job.sh",
        "milvus/servers.txt",
    ):
        assert f"===== {heading} " in text
    assert "qdrant rank 39 peer" in text and "milvus rank 0 etcd" in text


def test_local_configs_have_no_hpc_plan() -> None:
    assert render_plan(load_config(REPO / "configs" / "local.yaml")) == ""


# --- structure ---------------------------------------------------------------------------------------------


def layouts(platform: str) -> list[tuple[object, ClusterLayout]]:
    loaded = load_config(REPO / "configs" / f"{platform}.yaml")
    cfg = loaded.config
    node = node_shape(cfg.executor)
    return [
        (cfg, plan_cluster(s, cfg.vdb.cluster, node, Path("/work/vdb") / s.name, loaded.base_dir))
        for s in cfg.vdb.databases
    ]


@pytest.mark.parametrize("platform", ["polaris", "aurora", "slurm"])
def test_every_rank_has_distinct_ports_and_bound_cores(fixed_env: None, platform: str) -> None:
    for cfg, layout in layouts(platform):
        cluster = cfg.vdb.cluster.for_database(layout.database)
        ports = [p for r in layout.ranks for p in r.ports.values()]
        assert len(ports) == len(set(ports)), f"{layout.database}: a port is used twice"
        assert all(1024 <= p <= 65535 for p in ports)
        assert len(layout.ranks) == cluster.workers
        node = cfg.executor.node
        for rank in layout.ranks:
            assert len(rank.cores) == cluster.cores_per_worker
            socket = {c // node.cores_per_socket for c in rank.cores}
            assert len(socket) == 1, f"rank {rank.rank} spans sockets"
            assert not set(rank.cores) & set(node.reserved_cores)
        for slot in {r.node_slot for r in layout.ranks}:
            on_node = [c for r in layout.ranks if r.node_slot == slot for c in r.cores]
            assert len(on_node) == len(set(on_node)), "two ranks of a node share a core"
            assert sum(r.node_slot == slot for r in layout.ranks) <= cluster.workers_per_node


@pytest.mark.parametrize("platform", ["polaris", "aurora"])
def test_join_lists_name_existing_ranks(fixed_env: None, platform: str) -> None:
    for _cfg, layout in layouts(platform):
        ranks = {r.rank: r for r in layout.ranks}
        if layout.database == "weaviate":
            for r in layout.ranks:
                joined = dict(item.split(":") for item in r.env["RAFT_JOIN"].split(","))
                assert joined == {f"node{i}": str(ranks[i].ports["raft"]) for i in ranks}
                assert r.env["RAFT_BOOTSTRAP_EXPECT"] == str(len(ranks))
                assert r.env["RAFT_INTERNAL_RPC_PORT"] == str(r.ports["raft"] + 1)
                if r.rank == 0:
                    assert "CLUSTER_JOIN" not in r.env and not r.waits_for_rank0
                else:
                    assert r.env["CLUSTER_JOIN"] == f"${{VDB_RANK0_ADDR}}:{ranks[0].ports['gossip']}"
        if layout.database == "qdrant":
            assert "--bootstrap" not in ranks[0].argv
            for r in layout.ranks[1:]:
                boot = r.argv[r.argv.index("--bootstrap") + 1]
                assert boot == f"http://${{VDB_RANK0_ADDR}}:{ranks[0].ports['p2p']}"
            assert all(r.argv[r.argv.index("--uri") + 1].endswith(f":{r.ports['p2p']}") for r in layout.ranks)
        if layout.database == "milvus":
            assert ranks[0].role == "etcd"
            etcd = f"@VDB_RANK0_ADDR@:{ranks[0].ports['client']}"
            for r in layout.ranks[1:]:
                assert etcd in r.files["user.yaml"] and r.waits_for_rank0
            assert [ranks[i].role for i in layout.entry_ranks] == ["proxy"] * len(layout.entry_ranks)


@pytest.mark.parametrize("platform", ["polaris", "aurora"])
def test_storage_paths_come_from_the_config(fixed_env: None, platform: str) -> None:
    for cfg, layout in layouts(platform):
        storage = cfg.vdb.cluster.for_database(layout.database).storage
        base = storage.base_dir()
        assert base and layout.data_root.startswith(base.rstrip("/") + "/pes2o-vdb/")
        memory = storage.memory_path.rstrip("/") + "/pes2o-vdb/"
        for r in layout.ranks:
            # etcd keeps its data in tmpfs whatever the medium (never on Lustre or a DAOS mount)
            assert r.data_dir.startswith(memory if r.role == "etcd" else layout.data_root)
            for host, target in r.binds:
                assert host.startswith((layout.data_root, "${VDB_RANK_DIR}", memory))
                if "etcd" in target:
                    assert host.startswith(memory), (layout.database, r.rank, host)
        if layout.database == "milvus":  # distributed: every role shares the Lustre/DAOS directory
            assert layout.shared_data and all(
                (layout.shared_data, "/var/lib/milvus/shared") in r.binds
                for r in layout.ranks
                if r.role != "etcd"
            )
    polaris_milvus = dict((lay.database, lay) for _, lay in layouts(platform))["milvus"]
    expected = "/projects/MyProject/vdb-data" if platform == "polaris" else "/tmp/MyPool/vdb"
    assert polaris_milvus.data_root.startswith(expected)


@pytest.mark.parametrize("platform", ["polaris", "aurora", "slurm"])
def test_go_servers_get_as_many_threads_as_they_are_bound_to(fixed_env: None, platform: str) -> None:
    for cfg, layout in layouts(platform):
        for r in layout.ranks:
            if "GOMAXPROCS" in r.env:
                threads = len(r.cores) * cfg.executor.node.threads_per_core
                assert r.env["GOMAXPROCS"] == str(threads), (layout.database, r.rank)


def test_each_gpu_indexing_rank_gets_its_own_gpu(fixed_env: None) -> None:
    loaded = load_config(REPO / "configs" / "polaris.yaml")
    cfg = loaded.config
    cluster = cfg.vdb.cluster.model_copy(update={"gpu_indexing": True, "images": {"qdrant_gpu": "/q.sif"}})
    qdrant = next(s for s in cfg.vdb.databases if s.name == "qdrant")
    layout = plan_cluster(qdrant, cluster, node_shape(cfg.executor), Path("/work/vdb"), loaded.base_dir)
    for slot in {r.node_slot for r in layout.ranks}:
        gpus = [r.env["CUDA_VISIBLE_DEVICES"] for r in layout.ranks if r.node_slot == slot]
        assert len(gpus) == len(set(gpus)) and all(int(g) < cfg.executor.node.gpus for g in gpus)
    # ALCF's topology: rank 0 on cores 0-7 is nearest GPU 3, rank 3 on cores 24-31 nearest GPU 0
    # (docs/polaris/running-jobs/using-gpus.md: gpu = num_gpus - 1 - local_rank % num_gpus)
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in layout.ranks[:4]] == ["3", "2", "1", "0"]
    env_file = render_files(layout, cluster)["ranks/001/server.env"]
    assert 'CUDA_VISIBLE_DEVICES="2"' in env_file  # reaches the server through --env-file (--cleanenv)
    # an unbound rank still gets the GPU nearest the cores its position would have
    unbound = cluster.model_copy(update={"bind": "none"})
    layout = plan_cluster(qdrant, unbound, node_shape(cfg.executor), Path("/work/vdb"), loaded.base_dir)
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in layout.ranks[:4]] == ["3", "2", "1", "0"]


def test_launcher_lines(fixed_env: None) -> None:
    (_, qdrant), *_ = layouts("polaris")
    cfg = load_config(REPO / "configs" / "polaris.yaml").config
    line = launcher_command(qdrant, cfg.vdb.cluster, cfg.executor.node)
    assert line.startswith(
        "mpiexec -n 40 --ppn 4 --cpu-bind list:0-7,32-39:8-15,40-47:16-23,48-55:24-31,56-63 "
    )
    slurm_cfg = load_config(REPO / "configs" / "slurm.yaml").config
    (_, slurm_qdrant), *_ = layouts("slurm")
    srun = launcher_command(slurm_qdrant, slurm_cfg.vdb.cluster, slurm_cfg.executor.node)
    assert srun.startswith("srun --nodes=4 --ntasks=16 --ntasks-per-node=4 --cpu-bind=mask_cpu:0xffff")


@pytest.mark.parametrize("platform", ["polaris", "aurora"])
def test_rendered_shell_is_valid_bash(fixed_env: None, platform: str, tmp_path: Path) -> None:
    for _cfg, layout in layouts(platform):
        cluster = _cfg.vdb.cluster
        for rel, text in render_files(layout, cluster).items():
            if rel.endswith(".sh"):
                path = tmp_path / rel.replace("/", "_")
                path.write_text(text)
                result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
                assert result.returncode == 0, f"{layout.database}/{rel}: {result.stderr}"


# --- the pilot, for real, on this machine (LocalProvider, a stand-in for apptainer) ------------------------

FAKE_APPTAINER = r'''#!{python}
"""Stands in for `apptainer exec`: records its arguments, serves 200 on the rank's Qdrant address."""
import http.server, json, os, sys
args = sys.argv[1:]
env_file = args[args.index("--env-file") + 1]
env = dict(line.strip().split("=", 1) for line in open(env_file) if "=" in line)
env = {{k: v.strip('"') for k, v in env.items()}}
port = int(env["QDRANT__SERVICE__HTTP_PORT"])
record = os.path.join(os.environ["FAKE_RECORD_DIR"], f"{{port}}.json")
with open(record, "w") as fh:
    json.dump({{"argv": args, "env": env}}, fh)
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.HTTPServer((env["QDRANT__SERVICE__HOST"], port), Ok).serve_forever()  # the rank's address
'''


def two_local_ranks(tmp_path: Path, apptainer: Path, images: dict[str, str], **options: Any) -> Any:
    """A cluster block of two ranks on this machine (LocalProvider), on 20 free ports, memory storage."""
    from apps.vdb.cluster.config import DatabaseClusterConfig
    from apps.vdb.process import free_port_block

    base = free_port_block(20, host="0.0.0.0")  # free on every interface, below the ephemeral range
    return DatabaseClusterConfig(
        nodes=1,
        workers=2,
        workers_per_node=2,
        launcher="local",
        apptainer=str(apptainer),
        base_port=base,
        storage={"medium": "memory", "memory_path": str(tmp_path / "shm")},
        images=images,
        worker_init=[],
        **options,
    )


def test_cluster_deployment_runs_ranks_registers_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.vdb.process import port_in_use
    from apps.vdb.qdrant.settings import QdrantSettings
    from pipeline.config.model import LocalExecutorConfig

    fake = tmp_path / "apptainer"
    fake.write_text(FAKE_APPTAINER.format(python=sys.executable))
    fake.chmod(0o755)
    image = tmp_path / "qdrant.sif"
    image.write_bytes(b"SIF")
    records = tmp_path / "records"
    records.mkdir()
    monkeypatch.setenv("FAKE_RECORD_DIR", str(records))
    cluster = two_local_ranks(tmp_path, fake, {"qdrant": str(image)}, startup_timeout_s=60)
    base = cluster.base_port
    deployment = ClusterDeployment(QdrantSettings(mode="server"), cluster, LocalExecutorConfig(), poll_s=0.5)
    workdir = tmp_path / "server"
    # As the vdb runner does: the driver's phases, the ranks' sampler files merged after teardown.
    telemetry = DatabaseTelemetry(tmp_path, deployment.server_pids, rank_files=deployment.telemetry_files)
    telemetry.start()
    try:
        endpoints = deployment.start(workdir, timeout=60)
        telemetry.phase("query")
        time.sleep(1.5)  # a sample or two of each rank in this phase
        assert [n.rank for n in endpoints.nodes] == [0, 1]
        assert [n.port for n in endpoints.nodes] == [base, base + 10]
        assert all(n.extra["url"] == f"http://{n.host}:{n.port}" for n in endpoints.nodes)
        registry = read_registry(workdir / "cluster" / "registry")
        assert {r: e["state"] for r, e in registry.items()} == {0: "ready", 1: "ready"}
        rank0, rank1 = (json.loads((records / f"{p}.json").read_text()) for p in (base, base + 10))
        host0 = registry[0]["host"]
        assert rank1["argv"][rank1["argv"].index("--bootstrap") + 1] == f"http://{host0}:{base + 2}"
        assert "--bootstrap" not in rank0["argv"] and rank0["env"]["QDRANT__CLUSTER__ENABLED"] == "true"
        assert (tmp_path / "shm" / "pes2o-vdb").is_dir()
    finally:
        telemetry.phase("teardown")
        deployment.stop(grace=30)
        telemetry.stop()
    registry = read_registry(workdir / "cluster" / "registry")
    assert {e["state"] for e in registry.values()} == {"stopped"}
    # Each rank's sampler wrote its file before the rank registered "stopped"; the driver merged them.
    files = sorted(p.name for p in (workdir / "cluster" / "telemetry").glob("*.parquet"))
    assert files == ["rank-000.parquet", "rank-001.parquet"]
    rows = pq.read_table(tmp_path / "telemetry.parquet").to_pylist()
    assert {r["rank"] for r in rows} == {0, 1}
    assert {r["process"] for r in rows if r["role"] == "server"} == {"rank-000", "rank-001"}
    assert {r["node"] for r in rows} == {registry[0]["node"]}
    # The fake server exits at once on SIGTERM: teardown may have no sample, deploy and query have.
    assert {"deploy", "query"} <= {r["phase"] for r in rows}
    commands = [" ".join(q.info["cmdline"] or []) for q in psutil.process_iter(["cmdline"])]
    samplers = [c for c in commands if "apps.telemetry.sampler" in c and str(workdir) in c]
    assert not samplers, "a rank's sampler outlived its rank"
    assert {r["pid"] for r in rows if r["role"] == "server"} == {registry[0]["pid"], registry[1]["pid"]}
    deadline = time.monotonic() + 10
    while any(port_in_use(p) for p in (base, base + 10)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(port_in_use(p) for p in (base, base + 10)), "a server outlived stop()"
    assert not list((tmp_path / "shm" / "pes2o-vdb").rglob("rank-*")), "memory data left behind"


def test_cluster_deployment_reports_a_failed_rank_with_its_log(tmp_path: Path) -> None:
    from apps.vdb.base import DatabaseError
    from apps.vdb.cluster.config import DatabaseClusterConfig
    from apps.vdb.qdrant.settings import QdrantSettings
    from pipeline.config.model import LocalExecutorConfig

    broken = tmp_path / "apptainer"
    broken.write_text("#!/bin/sh\necho 'FATAL: image is not a SIF' >&2\nexit 3\n")
    broken.chmod(0o755)
    (tmp_path / "q.sif").write_bytes(b"x")
    cluster = DatabaseClusterConfig(
        workers=1,
        launcher="local",
        apptainer=str(broken),
        storage={"medium": "memory", "memory_path": str(tmp_path / "shm")},
        images={"qdrant": str(tmp_path / "q.sif")},
        worker_init=[],
        startup_timeout_s=30,
    )
    deployment = ClusterDeployment(QdrantSettings(mode="server"), cluster, LocalExecutorConfig(), poll_s=0.3)
    with pytest.raises(DatabaseError) as err:
        deployment.start(tmp_path / "server", timeout=30)
    assert "rank 0 failed to start" in str(err.value) and "FATAL: image is not a SIF" in str(err.value)
    assert re.search(r"rank-000\.log", str(err.value))


# --- runtime native (the local Slurm testbed) --------------------------------------------------------------


def test_native_ranks_run_the_executable_with_host_paths(fixed_env: None) -> None:
    loaded = load_config(REPO / "configs" / "slurm-local.yaml")
    cfg = loaded.config
    node = node_shape(cfg.executor)
    weaviate = next(s for s in cfg.vdb.databases if s.name == "weaviate")
    layout = plan_cluster(weaviate, cfg.vdb.cluster, node, Path("/work/vdb"), loaded.base_dir)
    files = render_files(layout, cfg.vdb.cluster)
    for r in layout.ranks:
        # the start script reads the deployment's API key from the rank's 0600 file, then execs the server
        assert r.argv[:3] == ["/bin/sh", "${VDB_RANK_DIR}/run/start-weaviate.sh", "${VDB_RANK_DIR}/run"]
        assert r.argv[3] == str((REPO / ".build" / "bin" / "weaviate-server").resolve())
        assert r.env["PERSISTENCE_DATA_PATH"] == r.data_dir  # the bind became a path rename
        assert not r.binds and r.data_dir.startswith("/dev/shm/pes2o-vdb/")
        script = files[f"ranks/rank-{r.rank:03d}.sh"]
        assert "apptainer" not in script and 'source "$VDB_RANK_DIR/run/server.env"' in script
    assert 'PERSISTENCE_DATA_PATH="/dev/shm/pes2o-vdb/' in files["ranks/000/server.env"]
    assert "@VDB_JOB@" in files["ranks/000/server.env"]  # filled in per job by vdb_render


def test_native_milvus_runs_the_package_binary_with_planned_ports(fixed_env: None) -> None:
    loaded = load_config(REPO / "configs" / "slurm-local.yaml")
    cfg = loaded.config
    milvus = next(s for s in cfg.vdb.databases if s.name == "milvus")
    layout = plan_cluster(milvus, cfg.vdb.cluster, node_shape(cfg.executor), Path("/w"), loaded.base_dir)
    (rank,) = layout.ranks
    assert rank.argv[:3] == [sys.executable, "-m", "apps.vdb.milvus.native"]
    ports = json.loads(rank.argv[rank.argv.index("--ports") + 1])
    assert ports["proxy_port"] == rank.ports["proxy"] and len(set(ports.values())) == len(ports)
    overrides = json.loads(rank.argv[rank.argv.index("--overrides") + 1])
    assert overrides["proxy.ip"] == "${VDB_ADDR}" and overrides["proxy.http.enabled"] is False


def test_native_needs_an_executable_where_there_is_no_bundled_one(fixed_env: None, tmp_path: Path) -> None:
    from pipeline.config.checks import check_platform

    loaded = load_config(REPO / "configs" / "slurm-local.yaml")
    cfg = loaded.config
    cfg.vdb.cluster.executables.clear()
    problems = dict(check_platform(cfg, loaded.base_dir))
    where = ("vdb", "cluster", "executables", "weaviate")
    assert "runtime native needs the server executable" in problems[where]
    cfg.vdb.cluster.executables["weaviate"] = str(tmp_path / "missing")
    problems = dict(check_platform(cfg, loaded.base_dir))
    assert "does not exist" in problems[where]


@pytest.mark.usefixtures("fixed_env")
@pytest.mark.parametrize("platform", ["polaris", "aurora"])
def test_hpc_configs_express_the_open_loop(platform: str) -> None:
    """An HPC config takes the open-loop knobs as a local one does: offered rates (or auto) in a database
    entry's query section, and both rates of the mixed workload as swept axes (paired: sweep: zip)."""
    from apps.vdb.config import VdbConfig

    vdb = load_config(REPO / "configs" / f"{platform}.yaml").config.vdb.model_dump(mode="json")
    vdb["databases"].append(
        {
            "name": "milvus",
            "label": "open-loop-milvus",
            "query": {"clients": [8], "rate": "auto", "p99_bound_ms": 20},
            "mixed": {"insert_rate": [1000, 4000], "query_rate": [200, 800], "query_clients": 4},
        }
    )
    points = [p for p in VdbConfig.model_validate(vdb).points if p.label.startswith("open-loop-milvus")]
    assert vdb["sweep"] == "zip"  # the study configs pair an entry's lists
    assert len(points) == 2 and all(p.config.cluster is not None for p in points)
    assert {p.config.query.rate for p in points} == {"auto"}
    axes = {(p.config.mixed.insert_rate, p.config.mixed.query_rate) for p in points}
    assert axes == {(1000, 200), (4000, 800)}


def test_a_dataset_entry_needs_no_variable_of_the_databases_it_replaces(
    fixed_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Aurora's own Fig. 2 points read the DAOS pool; the other datasets' entries replace vdb.databases
    with points that do not, so those runs validate without DAOS_POOL and DAOS_CONT."""
    from pipeline.config.loader import dataset_entries

    monkeypatch.delenv("DAOS_POOL")
    monkeypatch.delenv("DAOS_CONT")
    path = REPO / "configs" / "aurora.yaml"
    with pytest.raises(ConfigError, match="environment variable DAOS_POOL is not set"):
        load_config(path)
    entries = dataset_entries(path)
    assert entries
    for entry in entries:
        assert load_config(path, entry).dataset_entry == entry
