"""HPC configuration: the study configs validate, bad input is rejected with its field path, executors."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.errors import ConfigError
from executors.affinity import parse_list
from executors.config import (
    AuroraExecutorConfig,
    NodeShape,
    PolarisExecutorConfig,
    SlurmExecutorConfig,
    bind_lists,
    walltime_seconds,
)
from pipeline.config.checks import check_platform
from pipeline.config.loader import _line_of, load_config
from tests.conftest import REPO, SAMPLE, TERMS, run_cli

PLATFORMS = ("polaris", "aurora", "slurm")
IMAGES = ("qdrant_v1.16.2", "qdrant_v1.16.2-gpu-nvidia", "weaviate_1.36.0", "milvus_v2.6.6", "etcd_v3.5.18")


@pytest.fixture
def hpc_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The environment variables the study configs read, pointing at small files in tmp_path."""
    project = tmp_path / "project"
    (project / "vdb-data").mkdir(parents=True)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "s2ag-2k.jsonl.gz").write_bytes(SAMPLE.read_bytes())
    model = tmp_path / "models" / "Qwen3-Embedding-4B"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"hidden_size": 2560}')
    images = tmp_path / "images"
    images.mkdir()
    for name in IMAGES:
        (images / f"{name}.sif").write_bytes(b"SIF")
    env = {
        "ACCOUNT": "MyProject",
        "PROJECT_DIR": str(project),
        "PES2O_CORPUS": str(corpus),
        "MODEL_DIR": str(tmp_path / "models"),
        "VENV": str(tmp_path / "venv"),
        "IMAGES": str(images),
        "PES2O_TERMS": str(TERMS),
        "DAOS_POOL": "pool",
        "DAOS_CONT": "cont",
        "PARTITION": "gpu",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("QUEUE", raising=False)
    return tmp_path


def study(platform: str) -> dict[str, Any]:
    """configs/<platform>.yaml as data (``${ENV}`` references still unresolved)."""
    return yaml.safe_load((REPO / "configs" / f"{platform}.yaml").read_text())


def write(tmp_path: Path, data: dict[str, Any], name: str = "config.yaml") -> Path:
    path = tmp_path / "configs" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def problems_of(tmp_path: Path, data: dict[str, Any]) -> dict[tuple, str]:
    loaded = load_config(write(tmp_path, data))
    return dict(check_platform(loaded.config, loaded.base_dir))


# --- the study configurations ------------------------------------------------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
def test_study_config_loads_plans_and_passes_platform_checks(hpc_env: Path, platform: str) -> None:
    from pipeline.plan import build_plan

    loaded = load_config(REPO / "configs" / f"{platform}.yaml")
    cfg = loaded.config
    assert cfg.executor.platform == platform
    assert cfg.embedding.model_id == "Qwen/Qwen3-Embedding-4B"
    assert (cfg.embedding.backend, cfg.embedding.pooling, cfg.embedding.dtype) == (
        "transformers",
        "last_token",
        "bfloat16",
    )
    assert cfg.embedding.dimension == 2560 and cfg.queries.instruction
    assert cfg.vdb.cluster is not None
    assert check_platform(cfg, loaded.base_dir) == []
    plan = build_plan(loaded)
    assert plan.dimension == 2560 and "vdb" in plan.stages


def test_polaris_config_validates_on_the_command_line(hpc_env: Path) -> None:
    result = run_cli("validate", "configs/polaris.yaml", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


def test_plan_piped_keeps_paths_and_submit_lines_whole(hpc_env: Path) -> None:
    """Piped (80 columns to rich), `plan` once cut the stage folders with an ellipsis and broke the qsub
    lines and job script paths across lines; a user copies them from this output."""
    result = run_cli("plan", "configs/polaris.yaml", timeout=300, env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr[-3000:]
    store = hpc_env / "project" / "pes2o-ve" / "store"
    for name in ("shard", "chunk", "queries", "groundtruth", "vdb"):
        assert re.search(rf"{re.escape(str(store / name))}/[0-9a-f]{{16}} ", result.stdout), name
    submits = [line for line in result.stdout.splitlines() if line.startswith("# submit:")]
    assert submits and all(re.fullmatch(r"# submit: qsub .* /\S+", line) for line in submits), submits[:3]
    assert "…" not in result.stdout


def test_no_user_or_project_names_are_hard_coded() -> None:
    for platform in PLATFORMS:
        text = (REPO / "configs" / f"{platform}.yaml").read_text()
        assert "${ACCOUNT}" in text and "${PROJECT_DIR}" in text
        for fragment in ("/home/", "/lus/", "/eagle/projects", "/flare/"):
            assert fragment not in text, f"{platform}.yaml hard-codes {fragment}"


# --- bad input: each rejected with the field path ----------------------------------------------------------


def test_missing_account_is_rejected(hpc_env: Path) -> None:
    data = study("polaris")
    del data["executor"]["account"]
    with pytest.raises(ConfigError) as err:
        load_config(write(hpc_env, data))
    assert "executor.account" in str(err.value) and "Field required" in str(err.value)


def test_blank_account_is_rejected(hpc_env: Path) -> None:
    data = study("aurora")
    data["executor"]["account"] = "   "
    assert ("executor", "account") in problems_of(hpc_env, data)


def test_queue_that_does_not_allow_the_node_count(hpc_env: Path) -> None:
    data = study("polaris")
    data["executor"]["queue"] = "debug"  # 1-2 nodes
    data["vdb"]["cluster"]["queue"] = "debug"
    problems = problems_of(hpc_env, data)
    assert "accepts 1-2 nodes per job, not 16" in problems[("executor", "gpu", "nodes_per_block")]
    assert "not 10" in problems[("vdb", "cluster", "nodes")]
    assert "at most 01:00:00" in problems[("executor", "walltime")]


def test_routing_queue_rejects_a_walltime_its_execution_queue_cannot_grant(hpc_env: Path) -> None:
    data = study("polaris")  # 16 GPU nodes and 10 CPU/database nodes: prod routes them to small (3 h)
    data["executor"]["walltime"] = "06:00:00"
    message = problems_of(hpc_env, data)[("executor", "walltime")]
    assert "-node jobs to 'small' (10-24 nodes), which grants at most 03:00:00, not 06:00:00" in message
    data["executor"]["gpu"]["nodes_per_block"] = 30  # 30 nodes go to medium (6 h): the GPU block fits
    data["executor"]["cpu"]["nodes_per_block"] = 30
    data["vdb"]["cluster"]["walltime"] = "03:00:00"
    data["vdb"]["cluster"]["nodes"] = 10
    assert ("executor", "walltime") not in problems_of(hpc_env, data)


def test_routing_queue_without_a_route_for_the_node_count(hpc_env: Path) -> None:
    data = study("polaris")
    data["executor"]["queues"]["prod"]["routes"] = [
        {"queue": "small", "min_nodes": 10, "max_nodes": 12, "max_walltime": "03:00:00"}
    ]
    message = problems_of(hpc_env, data)[("executor", "gpu", "nodes_per_block")]
    assert "queue 'prod' routes no queue for 16 nodes (small 10-12)" in message


def test_database_job_must_outlast_its_stage_timeouts(hpc_env: Path) -> None:
    data = study("polaris")
    data["vdb"]["index_timeout_s"] = 14400  # the old config: 4 h of index in a 3 h job
    message = problems_of(hpc_env, data)[("vdb", "cluster", "walltime")]
    assert "the database job's walltime 03:00:00 (10800 s) does not outlast" in message
    assert "startup 900 + 2 insert sweep(s) x 3000 + index 14400 = 21300 s" in message


def test_one_allocation_checks_the_stage_timeouts_against_the_one_jobs_walltime(hpc_env: Path) -> None:
    """Under ``allocation: one`` the database runs inside the one job: vdb.cluster.walltime (3 h here) is
    never asked of the scheduler, so start-up, insert sweeps and index must fit executor.walltime."""
    data = study("polaris")
    data["executor"]["allocation"] = "one"
    data["executor"]["gpu"]["max_blocks"] = 1  # one allocation holds one block of each
    data["executor"]["walltime"] = "01:00:00"
    data["vdb"]["insert"]["timeout_s"] = 3000  # 900 + 2 x 3000 + index > 1 h, < the cluster's 3 h
    problems = problems_of(hpc_env, data)
    message = problems[("executor", "walltime")]
    assert "the one allocation's walltime 01:00:00 (3600 s) does not outlast" in message
    assert ("vdb", "cluster", "walltime") not in problems  # not the job's: no message points there
    data["executor"]["allocation"] = "separate"  # its own 3 h job: the same timeouts fit
    assert "does not outlast" not in problems_of(hpc_env, data).get(("executor", "walltime"), "")


def test_a_walltime_several_jobs_share_names_the_job_each_refusal_is_about(hpc_env: Path) -> None:
    data = study("polaris")
    data["executor"]["queue"] = "debug"  # at most 1 h; the GPU and CPU blocks take executor.walltime
    data["executor"]["walltime"] = "04:00:00"
    loaded = load_config(write(hpc_env, data))
    messages = [
        m for field, m in check_platform(loaded.config, loaded.base_dir) if field == ("executor", "walltime")
    ]
    assert "the gpu block: queue 'debug' allows at most 01:00:00, not 04:00:00" in messages
    assert "the cpu block: queue 'debug' allows at most 01:00:00, not 04:00:00" in messages


def test_queue_missing_from_the_limits_table(hpc_env: Path) -> None:
    data = study("polaris")
    data["executor"]["queue"] = "nosuchqueue"
    assert "is not in executor.queues" in problems_of(hpc_env, data)[("executor", "queue")]


def test_queue_problem_is_reported_at_plan_time_with_line_numbers(hpc_env: Path) -> None:
    from pipeline.hpc_plan import check_or_raise

    data = study("polaris")
    data["executor"]["queue"] = "debug"
    loaded = load_config(write(hpc_env, data))
    with pytest.raises(ConfigError) as err:
        check_or_raise(loaded)
    message = str(err.value)
    assert "executor.gpu.nodes_per_block: queue 'debug' accepts 1-2" in message
    assert err.value.line is not None and "line " in message


@pytest.mark.parametrize("walltime", ["6h", "06:00", "1:75:00", "abc"])
def test_malformed_walltime(hpc_env: Path, walltime: str) -> None:
    data = study("polaris")
    data["executor"]["walltime"] = walltime
    with pytest.raises(ConfigError) as err:
        load_config(write(hpc_env, data))
    assert "executor.walltime" in str(err.value) and "HH:MM:SS" in str(err.value)


def test_image_path_that_does_not_exist(hpc_env: Path) -> None:
    (hpc_env / "images" / "weaviate_1.36.0.sif").unlink()
    problems = problems_of(hpc_env, study("polaris"))
    assert "does not exist" in problems[("vdb", "cluster", "images", "weaviate")]


def test_gpu_indexing_needs_the_gpu_image(hpc_env: Path) -> None:
    data = study("polaris")
    del data["vdb"]["cluster"]["images"]["qdrant_gpu"]
    assert (
        "no Apptainer image for qdrant"
        in problems_of(hpc_env, data)[("vdb", "cluster", "images", "qdrant_gpu")]
    )


def test_more_workers_per_node_than_allowed(hpc_env: Path) -> None:
    data = study("polaris")
    data["vdb"]["cluster"]["workers_per_node"] = 5
    with pytest.raises(ConfigError) as err:
        load_config(write(hpc_env, data))
    assert "vdb.cluster.workers_per_node" in str(err.value) and "less than or equal to 4" in str(err.value)


def test_daos_on_polaris_is_rejected(hpc_env: Path) -> None:
    data = study("polaris")
    data["vdb"]["cluster"]["storage"]["medium"] = "daos"
    data["vdb"]["cluster"]["storage"]["daos"] = {"pool": "p", "container": "c"}
    problems = problems_of(hpc_env, data)
    assert problems[("vdb", "cluster", "storage", "medium")] == "polaris offers memory, ssd, lustre; not daos"


def test_qdrant_and_weaviate_on_daos_need_the_caching_mount(hpc_env: Path) -> None:
    """They mmap their files: on Aurora's plain dfuse mount they are refused, naming ALCF's caching mount,
    which is accepted."""
    data = study("aurora")
    data["vdb"]["cluster"]["storage"] = {"medium": "daos", "daos": {"pool": "p", "container": "c"}}
    problem = problems_of(hpc_env, data)[("vdb", "cluster", "storage", "medium")]
    caching = "launch-dfuse-with-caching.sh {pool}:{container}"
    assert "weaviate mmaps its files" in problem and caching in problem
    data["vdb"]["cluster"]["storage"]["daos"]["mount_command"] = caching
    assert ("vdb", "cluster", "storage", "medium") not in problems_of(hpc_env, data)


def test_milvus_distributed_needs_shared_storage(hpc_env: Path) -> None:
    data = study("polaris")
    data["vdb"]["cluster"]["overrides"]["milvus"]["storage"] = {"medium": "memory"}
    problems = problems_of(hpc_env, data)
    assert "needs lustre or daos" in problems[("vdb", "cluster", "overrides", "milvus", "storage", "medium")]


def test_milvus_distributed_rank_count_must_match_workers(hpc_env: Path) -> None:
    data = study("polaris")
    data["vdb"]["cluster"]["overrides"]["milvus"]["milvus"]["proxies"] = 4
    problems = problems_of(hpc_env, data)
    assert "set workers: 28" in problems[("vdb", "cluster", "workers")]


@pytest.mark.parametrize("platform", ["polaris", "aurora"])
def test_milvus_must_accept_the_collection_s_shards(hpc_env: Path, platform: str) -> None:
    """proxy.maxShardNum (16 by default) below vdb.collection.shards: Milvus would refuse the collection."""
    data = study(platform)
    milvus = next(db for db in data["vdb"]["databases"] if db["name"] == "milvus")
    shards = data["vdb"]["collection"]["shards"]
    assert milvus["config_overrides"] == {"proxy.maxShardNum": shards}  # the study configs raise it
    del milvus["config_overrides"]
    message = problems_of(hpc_env, data)[("vdb", "collection", "shards")]
    assert f"set config_overrides: {{proxy.maxShardNum: {shards}}}" in message
    milvus["config_overrides"] = {"proxy.maxShardNum": 20}
    where = ("vdb", "databases", 1, "config_overrides", "proxy.maxShardNum")
    assert f"20 is below vdb.collection.shards ({shards})" in problems_of(hpc_env, data)[where]
    milvus["config_overrides"] = {"proxy.maxShardNum": "lots"}
    assert "must be a whole number" in problems_of(hpc_env, data)[where]
    milvus["config_overrides"] = {"proxy.maxShardNum": str(shards)}
    assert problems_of(hpc_env, data) == {}


def test_lustre_directory_must_exist(hpc_env: Path) -> None:
    (hpc_env / "project" / "vdb-data").rmdir()
    problems = problems_of(hpc_env, study("polaris"))
    assert "does not exist" in problems[("vdb", "cluster", "overrides", "milvus", "storage", "lustre_path")]
    # The Fig. 2 entries write `storage: {medium: [memory, ssd, lustre]}`: their lustre_path is the shared
    # section's, named where it is written, not at the entry that merely inherits it.
    assert "does not exist" in problems[("vdb", "cluster", "storage", "lustre_path")]
    assert not [loc for loc in problems if loc[:2] == ("vdb", "databases")], problems
    # Written nowhere: named at the entry that asks for Lustre, where it would be added.
    data = study("polaris")
    del data["vdb"]["cluster"]["storage"]["lustre_path"]
    entries = [i for i, db in enumerate(data["vdb"]["databases"]) if "lustre" in str(db.get("cluster"))]
    needs = {loc for loc, text in problems_of(hpc_env, data).items() if "needs lustre_path" in text}
    assert entries and needs == {
        ("vdb", "databases", i, "cluster", "storage", "lustre_path") for i in entries
    }


def test_cores_must_fit_one_socket_per_rank(hpc_env: Path) -> None:
    data = study("aurora")
    data["vdb"]["cluster"]["cores_per_worker"] = 30  # two per socket need 60 of 51 usable cores
    assert "do not fit one socket" in problems_of(hpc_env, data)[("vdb", "cluster", "cores_per_worker")]


def test_shards_must_cover_every_worker(hpc_env: Path) -> None:
    data = study("polaris")
    data["vdb"]["collection"]["shards"] = 4
    assert "set shards: 40" in problems_of(hpc_env, data)[("vdb", "collection", "shards")]
    # Workers that do not fit their nodes are the problem named, not the shards they would need.
    data["vdb"]["cluster"]["workers"] = 200
    said = list(problems_of(hpc_env, data).values())
    assert any("200 workers do not fit on" in text for text in said), said
    assert not any("set shards" in text for text in said), said


def test_gpu_indexing_is_rejected_on_aurora(hpc_env: Path) -> None:
    data = study("aurora")
    data["vdb"]["cluster"]["gpu_indexing"] = True
    data["vdb"]["cluster"]["images"]["qdrant_gpu"] = "${IMAGES}/qdrant_v1.16.2-gpu-nvidia.sif"
    assert "not Intel GPUs" in problems_of(hpc_env, data)[("vdb", "cluster", "gpu_indexing")]


def test_qdrant_with_a_cluster_is_a_pilot_or_runs_inside_its_clients(hpc_env: Path) -> None:
    data = study("polaris")
    data["vdb"]["databases"][0]["url"] = "http://elsewhere:6333"  # an external server: not with a cluster
    assert ("vdb", "databases", 0, "url") in problems_of(hpc_env, data)
    data["vdb"]["databases"][0] = {"name": "qdrant", "mode": "edge"}  # in-process: no pilot, no image
    # the study's Qdrant sweeps run servers from the image: left out here
    data["vdb"]["databases"] = [db for db in data["vdb"]["databases"] if "label" not in db]
    data["vdb"]["cluster"]["images"].pop("qdrant", None)
    found = problems_of(hpc_env, data)
    assert not {k: v for k, v in found.items() if "qdrant" in f"{k} {v}"}, found


def test_a_local_weaviate_cluster_size_is_refused_under_a_pilot(hpc_env: Path) -> None:
    """weaviate.nodes starts a local cluster's processes: a pilot ignored it, so a sweep over it ran one
    deployment under several labels (the same key). Refused, each swept value at its own index."""
    data = study("polaris")
    databases = data["vdb"]["databases"]
    index = next(i for i, db in enumerate(databases) if db["name"] == "weaviate" and "label" not in db)
    databases[index]["nodes"] = [1, 2]
    found = problems_of(hpc_env, data)
    said = found[("vdb", "databases", index, "nodes", 1)]
    assert said.startswith("with vdb.cluster, nodes: 2 (a local cluster's process count) does not apply")
    assert ("vdb", "databases", index, "nodes", 0) not in found  # 1: a single process, as the pilot's


@pytest.mark.parametrize("block", ["gpu", "cpu"])
def test_a_worker_larger_than_a_node_is_refused_at_its_line(hpc_env: Path, block: str) -> None:
    """Parsl started no worker ("Manager will spawn 0 workers") and the run waited out its walltime."""
    data = study("polaris")
    data["executor"][block]["cores_per_worker"] = 65  # a Polaris node: 32 cores x 2 threads
    with pytest.raises(ConfigError) as err:
        load_config(write(hpc_env, data))
    message = str(err.value)
    assert f"executor.{block}.cores_per_worker: 65 hardware threads per worker, but a node" in message
    assert "has 64: no worker would start" in message and err.value.line is not None


def test_unknown_key_in_a_platform_section_is_rejected(hpc_env: Path) -> None:
    data = copy.deepcopy(study("aurora"))
    data["executor"]["gpu"]["gpus"] = 6
    with pytest.raises(ConfigError) as err:
        load_config(write(hpc_env, data))
    assert "executor.gpu.gpus" in str(err.value)


@pytest.mark.parametrize("platform", ["polaris", "aurora"])
def test_semantic_chunking_runs_on_the_gpu_workers_beside_the_model(hpc_env: Path, platform: str) -> None:
    """Semantic chunking loads the embedding model: on the CPU block every worker would take GPU 0."""
    from pipeline.dag import DagRunner
    from pipeline.plan import build_plan

    data = study(platform)
    assert data["chunking"]["method"] == "semantic"
    runner = DagRunner(build_plan(load_config(write(hpc_env, data))), None, None)
    assert runner.apps["chunk"].executors == ["workers"] == runner.apps["embed"].executors
    data["chunking"] = {"method": "recursive", "chunk_size": 256, "chunk_overlap": 32}
    runner = DagRunner(build_plan(load_config(write(hpc_env, data))), None, None)
    assert runner.apps["chunk"].executors == ["cpu"]  # only the tokenizer: the CPU block


# --- model helpers -----------------------------------------------------------------------------------------


def test_walltime_and_binding_helpers() -> None:
    assert walltime_seconds("06:00:00") == 21600 and walltime_seconds("100:30:15") == 361815
    aurora = NodeShape(sockets=2, cores_per_socket=52, gpus=6, reserved_cores=[0, 52])
    lists = bind_lists(aurora, 4, 24)
    assert lists is not None
    assert [(min(c), max(c)) for c in lists] == [(1, 24), (25, 48), (53, 76), (77, 100)]
    assert all(0 not in c and 52 not in c for c in lists)
    assert bind_lists(aurora, 4, 26) is None  # 2 x 26 > 51 usable cores per socket


def test_no_aurora_worker_is_bound_to_a_reserved_core(hpc_env: Path) -> None:
    """Cores 0 and 52 (and their hyper-threads 104 and 156) are Aurora's system cores: no worker gets one.

    Parsl starts min(workers_per_node, 208 threads // cores_per_worker) workers and gives worker i the
    i-th entry of a ``list:`` affinity; with ``block`` it would divide all 208 threads, 0 and 52 included.
    """
    executor = load_config(REPO / "configs" / "aurora.yaml").config.executor
    assert study("aurora")["executor"]["cpu"]["cpu_affinity"] == "block"  # as written: resolved on load
    reserved = {0, 52, 104, 156}
    for block, most in ((executor.cpu, executor.cpu.workers_per_node), (executor.gpu, 12)):
        workers = min(most, int(208 // block.cores_per_worker))
        shares = parse_list(block.cpu_affinity)
        assert len(shares) == workers, "Parsl refuses a list with another number of entries"
        threads = [t for share in shares for t in share]
        assert not reserved & set(threads) and len(threads) == len(set(threads)) and max(threads) < 208
    cpu_shares = parse_list(executor.cpu.cpu_affinity)
    assert cpu_shares[0] == [1, 2, 105, 106]  # whole cores with their hyper-threads
    assert all(len({t % 104 // 52 for t in s}) == 1 for s in cpu_shares)  # each inside one socket
    data = study("aurora")
    data["executor"]["cpu"]["cpu_affinity"] = "list:" + ":".join(f"{4 * i}-{4 * i + 3}" for i in range(48))
    binds = r"cpu.cpu_affinity binds the reserved cores' threads \[0, 52, 104, 156\]"
    with pytest.raises(ConfigError, match=binds):
        load_config(write(hpc_env, data))


def test_platform_defaults_are_machine_facts_only() -> None:
    polaris = PolarisExecutorConfig(account="A", queue="debug", walltime="01:00:00")
    aurora = AuroraExecutorConfig(account="A", queue="debug", walltime="01:00:00")
    slurm = SlurmExecutorConfig(partition="gpu", walltime="01:00:00")
    assert polaris.gpu.accelerator_ids == ["0", "1", "2", "3"] and polaris.interface == "bond0"
    assert len(aurora.gpu.accelerator_ids) == 12 and aurora.node.reserved_cores == [0, 52]
    assert "daos" in aurora.storage_media and "daos" not in polaris.storage_media
    assert slurm.account is None


# --- executors ---------------------------------------------------------------------------------------------


def test_retry_handler_retries_lost_workers_not_bad_input() -> None:
    from parsl.executors.high_throughput.errors import ManagerLost, WorkerLost

    from apps.vdb.base import DatabaseError
    from core.errors import InputDataError
    from executors.hpc import retry_handler

    assert retry_handler(ManagerLost(b"m1", "x3001c0s1b0n0"), {}) == 1.0
    assert retry_handler(WorkerLost(3, "x3001c0s1b0n0"), {}) == 1.0
    for bad in (
        ConfigError("bad"),
        InputDataError("corrupt line"),
        DatabaseError("lost rows"),
        ValueError("bug"),
    ):
        assert retry_handler(bad, {}) == float("inf")


def test_workers_drain_before_the_walltime_of_the_job_they_run_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CPU block of 20 min: its own job's walltime when separate; inside one allocation, the one job's
    40 min (executor.walltime), less the drain margin either way."""
    from executors.allocation import NodeSplit
    from executors.platforms import parsl_config_for

    drains = {}
    for allocation in ("separate", "one"):
        monkeypatch.setenv("ALLOCATION", allocation)
        executor = load_config(REPO / "configs" / "slurm-local.yaml").config.executor
        cpu = executor.cpu.model_copy(update={"walltime": "00:20:00"})
        executor = executor.model_copy(update={"drain_margin_s": 600, "cpu": cpu})
        split = NodeSplit(["n1"], ["n2"], ["n3"]) if allocation == "one" else None
        config = parsl_config_for(executor, tmp_path / allocation / "runs" / "r1", split=split)
        drains[allocation] = {e.label: getattr(e, "drain_period", None) for e in config.executors}
    assert drains["separate"] == {"workers": 1800, "cpu": 600, "driver": None}
    assert drains["one"] == {"workers": 1800, "cpu": 1800, "driver": None}


def test_memoizer_loads_checkpoints_of_earlier_runs(tmp_path: Path) -> None:
    from parsl.dataflow.memoization import BasicMemoizer

    from executors.hpc import memoizer

    earlier = tmp_path / "runs" / "earlier" / "parsl" / "000" / "checkpoint"
    earlier.mkdir(parents=True)
    (earlier / "tasks.pkl").write_bytes(b"")
    memo = memoizer(tmp_path / "runs" / "now", "task_exit")
    assert isinstance(memo, BasicMemoizer) and memo.checkpoint_mode == "task_exit"
    assert memo.checkpoint_files == [str(earlier)]
    assert memoizer(tmp_path / "runs" / "now", None).checkpoint_files == []


@pytest.mark.parametrize("platform", PLATFORMS)
def test_parsl_config_for_each_platform(
    hpc_env: Path, platform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import parsl.addresses

    from executors.platforms import parsl_config_for

    monkeypatch.setattr(parsl.addresses, "address_by_interface", lambda ifname: "10.1.2.3")
    cfg = load_config(REPO / "configs" / f"{platform}.yaml").config
    config = parsl_config_for(cfg.executor, hpc_env / "runs" / "r1")
    labels = [e.label for e in config.executors]
    assert labels == ["workers", "cpu", "driver"]
    gpu, cpu = config.executors[0], config.executors[1]
    assert gpu.prefetch_capacity == 0 and gpu.available_accelerators == cfg.executor.gpu.accelerator_ids
    assert gpu.max_workers_per_node == len(gpu.available_accelerators)
    assert cpu.max_workers_per_node == cfg.executor.cpu.workers_per_node
    assert config.retries == 2 and config.retry_handler is not None
    assert config.memoizer.checkpoint_mode == "task_exit"
    assert config.run_dir == str(hpc_env / "runs" / "r1" / "parsl")
    if platform == "polaris":
        assert gpu.address == "10.1.2.3"
        assert gpu.cpu_affinity == "list:24-31,56-63:16-23,48-55:8-15,40-47:0-7,32-39"  # ALCF's Parsl page
        assert gpu.provider.account == "MyProject" and gpu.provider.queue == "prod"
        assert gpu.provider.select_options == "ngpus=4"
        assert "#PBS -l filesystems=home:eagle" in gpu.provider.scheduler_options
        assert gpu.provider.launcher.overrides == "--depth=64 --ppn 1"
    if platform == "aurora":
        assert gpu.available_accelerators[:2] == ["0.0", "0.1"] and gpu.cpu_affinity.startswith("list:1-8")
        assert gpu.address == "10.1.2.3"  # bound to hsn0, as ALCF's Aurora Parsl page does
        assert "#PBS -l filesystems=home:flare" in gpu.provider.scheduler_options
    if platform == "slurm":
        assert "--partition=gpu" in gpu.provider.scheduler_options
        assert "--gpus-per-node=4" in gpu.provider.scheduler_options


def test_database_job_and_worker_blocks_share_the_provider_functions(tmp_path: Path) -> None:
    from parsl.launchers import SimpleLauncher, SrunLauncher

    from apps.vdb.cluster.config import DatabaseClusterConfig
    from apps.vdb.cluster.provider import cluster_provider
    from executors.platforms import parsl_config_for

    slurm = SlurmExecutorConfig(
        partition="gpu",
        walltime="01:00:00",
        cores_per_node=64,
        mem_per_node=256,
        gpus_per_node=4,
        scheduler_options=["#SBATCH --x"],
    )
    workers = parsl_config_for(slurm, tmp_path, address="10.0.0.1").executors[0].provider
    pilot = cluster_provider(slurm, DatabaseClusterConfig(queue="db", scheduler_options=["#SBATCH --y"]))
    assert type(pilot) is type(workers)
    assert (workers.cores_per_node, workers.mem_per_node, workers.gpus_per_node) == (64, 256, 4)
    # The database job places its ranks with its own srun, and asks for GPUs only to build indexes on them.
    assert (pilot.cores_per_node, pilot.mem_per_node, pilot.gpus_per_node) == (None, None, None)
    assert "--partition=db" in pilot.scheduler_options
    assert "#SBATCH --x\n#SBATCH --y" in pilot.scheduler_options
    assert isinstance(pilot.launcher, SimpleLauncher) and isinstance(workers.launcher, SrunLauncher)
    assert "export PATH=" in workers.worker_init and "export PATH=" not in pilot.worker_init


def test_every_hpc_field_is_described() -> None:
    import inspect

    from pydantic import BaseModel

    import apps.vdb.cluster.config
    import executors.config

    models = [
        cls
        for module in (executors.config, apps.vdb.cluster.config)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, BaseModel) and cls.__module__ == module.__name__
    ]
    missing = [
        f"{m.__name__}.{name}" for m in models for name, f in m.model_fields.items() if not f.description
    ]
    assert missing == []


def test_image_and_override_names_come_from_the_registered_databases(hpc_env: Path) -> None:
    from apps.vdb import databases

    image_names = {name for db in databases() for name in db.images}
    assert {"qdrant", "qdrant_gpu", "weaviate", "milvus", "etcd"} <= image_names
    for db in databases():  # every database with a server has its own image as a known key
        assert db.name in image_names or not db.served
    data = study("polaris")
    data["vdb"]["cluster"]["images"]["mongo"] = "/images/mongo.sif"
    with pytest.raises(ConfigError, match=r"vdb\.cluster\.images: .*unknown image\(s\) mongo; known: etcd"):
        load_config(write(hpc_env, data))
    data = study("polaris")
    data["vdb"]["cluster"]["overrides"]["mongo"] = {"nodes": 2}
    with pytest.raises(ConfigError, match=r"vdb\.cluster\.overrides: .*unknown database\(s\) mongo"):
        load_config(write(hpc_env, data))


def test_a_slurm_job_ending_past_its_time_limit_is_described_as_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scontrol shows COMPLETING (reason TimeLimit) while Slurm ends a job past its walltime: a TIMEOUT."""
    import subprocess

    from parsl.providers import SlurmProvider

    from executors.providers import describe_job, job_ended

    def scontrol(state: str, reason: str):
        def run(*_args: object, **_kwargs: object) -> subprocess.CompletedProcess[str]:
            out = f"JobId=16 JobName=pes2o-vdb JobState={state} Reason={reason} Dependency=(null)"
            return subprocess.CompletedProcess(["scontrol"], 0, stdout=out, stderr="")

        return run

    provider = SlurmProvider(partition="debug")
    monkeypatch.setattr(subprocess, "run", scontrol("COMPLETING", "TimeLimit"))
    assert describe_job(provider, "16") == "TIMEOUT, reason TimeLimit"
    monkeypatch.setattr(subprocess, "run", scontrol("COMPLETING", "None"))
    assert describe_job(provider, "16") == "COMPLETING"
    assert job_ended("TIMEOUT, reason TimeLimit") and job_ended("COMPLETING")


def test_the_gpu_nearest_a_rank_follows_the_node_topology() -> None:
    """Polaris: GPU 0 sits next to cores 24-31 (ALCF); a node without that fact counts GPUs in order."""
    from executors.config import NodeShape, PolarisExecutorConfig

    polaris = PolarisExecutorConfig(account="a", queue="debug", walltime="01:00:00").node
    assert [polaris.nearest_gpu(list(range(c, c + 8)), i) for i, c in enumerate((0, 8, 16, 24))] == [
        3,
        2,
        1,
        0,
    ]
    assert polaris.nearest_gpu([], 1) == 1  # no position known: round robin
    plain = NodeShape(sockets=1, cores_per_socket=32, gpus=4)
    assert plain.nearest_gpu([0, 1], 2) == 2
    with pytest.raises(ValueError, match="gpu_cores lists 2 GPUs, the node has gpus: 4"):
        NodeShape(gpus=4, gpu_cores=[[0], [1]])
    with pytest.raises(ValueError, match=r"cores \[40\] outside"):
        NodeShape(cores_per_socket=32, gpus=1, gpu_cores=[[40]])


def test_platform_problems_are_listed_in_the_files_order_each_once(hpc_env: Path) -> None:
    """configs/polaris.yaml as shipped: its entries inherit one Lustre directory, so a missing one is one
    line, at the field that writes it, naming the other field that holds it; lines come in the file's
    order."""
    from pipeline.hpc_plan import check_or_raise

    (hpc_env / "project" / "vdb-data").rmdir()
    for image in ("weaviate_1.36.0", "qdrant_v1.16.2"):
        (hpc_env / "images" / f"{image}.sif").unlink()
    with pytest.raises(ConfigError) as err:
        check_or_raise(load_config(REPO / "configs" / "polaris.yaml"))
    listed = str(err.value).splitlines()[1:]
    numbers = [int(line.split(":")[0].removeprefix("  line ")) for line in listed]
    assert numbers == sorted(numbers) and err.value.line == numbers[0]
    missing = [line for line in listed if "vdb-data does not exist" in line]
    assert len(missing) == 1, listed
    # the shared section's line, where the value is written (the Fig. 2 entries that inherit it write
    # only `storage: {medium: [...]}`), the variable it came from, then the override's own Lustre path
    lustre = _line_of(
        load_config(REPO / "configs" / "polaris.yaml").node, ("vdb", "cluster", "storage", "lustre_path")
    )
    assert re.fullmatch(
        rf"  line {lustre}: vdb\.cluster\.storage\.lustre_path: directory \S+ does not exist "
        r"\(written as \$\{PROJECT_DIR\}/vdb-data; "
        r"also line \d+: vdb\.cluster\.overrides\.milvus\.storage\.lustre_path\)",
        missing[0],
    ), missing
    assert len(listed) == 3  # the directory and the two images
    # a field the file does not write is said to be so, not run on after another line's fields
    from pipeline.hpc_plan import _on_line

    assert (_on_line(12, 12), _on_line(30, 12), _on_line(None, 12)) == ("", "line 30: ", "not in the file: ")
    assert _on_line(None, None) == ""


@pytest.mark.parametrize("platform", ["polaris", "aurora"])
def test_a_given_dataset_starts_its_gpu_block_only_on_demand(
    hpc_env: Path, platform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study entry that imports its dataset embeds nothing: its GPU block (16 nodes on Polaris) is not
    submitted with the run, only if exact ground truth needs it; the client block is as the file says."""
    from pipeline.hpc_plan import parsl_config, render_plan

    monkeypatch.setenv("GIST_DIR", str(hpc_env))
    own = load_config(REPO / "configs" / f"{platform}.yaml")
    given = load_config(REPO / "configs" / f"{platform}.yaml", dataset="gist-1m")
    started = [e.provider.init_blocks for e in parsl_config(own).executors[:2]]
    assert started[0] >= 1  # the file's own run embeds: its GPU block starts with it
    assert [e.provider.init_blocks for e in parsl_config(given).executors[:2]] == [0, started[1]]
    assert "not started with the run: only for exact ground truth" in render_plan(given, check=False)
    assert "not started with the run" not in render_plan(own, check=False)
