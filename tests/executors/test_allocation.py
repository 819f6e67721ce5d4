"""One allocation (executors/allocation.py): the job's nodes split by role, each role's launches kept on its
nodes, the plan's one job script, and the queue checks counting one job. The run itself goes through the
Slurm testbed in tests/slurm/test_slurm_local.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.vdb.cluster.layout import node_shape, plan_cluster
from apps.vdb.cluster.render import launcher_command
from core.errors import ConfigError
from executors.allocation import job_hosts, nodes_needed, restrict_to, split_hosts
from pipeline.config.checks import jobs_held_at_once, per_user_limit_problems
from pipeline.config.loader import load_config
from pipeline.hpc_plan import render_artifacts
from tests.conftest import REPO


@pytest.fixture
def one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("ALLOCATION", "one")
    monkeypatch.setenv("PIPELINE_WORKDIR", str(tmp_path / "w"))
    return load_config(REPO / "configs" / "slurm-local.yaml")


def test_the_jobs_nodes_go_gpu_then_cpu_then_databases(one) -> None:
    cfg = one.config
    assert nodes_needed(cfg.executor, cfg.vdb) == (1, 1, 2)  # Weaviate's 2-node pilot is the largest
    split = split_hosts(cfg.executor, cfg.vdb, ["n1", "n2", "n3", "n4"])
    assert (split.gpu, split.cpu, split.databases) == (["n1"], ["n2"], ["n3", "n4"])
    with pytest.raises(ConfigError, match=r"the job has 3 node\(s\), the run needs 4"):
        split_hosts(cfg.executor, cfg.vdb, ["n1", "n2", "n3"])


def test_job_hosts_come_from_the_scheduler(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("x3\nx3\nx1\nx1\nx2\n")  # PBS lists a node once per chunk
    assert job_hosts({"PBS_NODEFILE": str(nodefile)}) == ["x3", "x1", "x2"]
    with pytest.raises(ConfigError, match="not inside a batch job"):
        job_hosts({})


def test_each_role_launches_only_on_its_nodes(tmp_path: Path) -> None:
    init, options = restrict_to("slurm", "cpu", ["n2"], tmp_path)
    # its own command file name: Parsl's SrunLauncher writes cmd_$SLURM_JOB_NAME.sh for every block
    assert (init, options) == ("export SLURM_JOB_NAME=pes2o-cpu", "--nodes=1 --nodelist=n2")
    init, options = restrict_to("polaris", "gpu", ["x1", "x2"], tmp_path)
    assert options == "" and init.endswith(f"export PBS_NODEFILE={tmp_path}/allocation/gpu.nodes")
    assert "printf '%s\\n' x1 x2 >" in init
    with pytest.raises(ConfigError, match="no host name"):
        restrict_to("slurm", "cpu", ["n2; rm -rf ~"], tmp_path)


def test_the_plan_shows_one_job_and_the_blocks_inside_it(one) -> None:
    artifacts = render_artifacts(one)
    job = artifacts["job-allocation.sh"]
    assert job.startswith("# submit: sbatch ") and "#SBATCH --nodes=4" in job
    assert "export ALLOCATION=one" in job and "-m pipeline run " in job
    assert "srun --ntasks 1 -l --nodes=1 --nodelist=<gpu-node-1>" in artifacts["block-workers.sh"]
    assert "--nodelist=<cpu-node-1>" in artifacts["block-cpu.sh"]
    assert not any(name.startswith("job-") and name != "job-allocation.sh" for name in artifacts)
    weaviate = artifacts["weaviate/job.sh"]
    assert weaviate.startswith("# started inside the allocation")
    assert "srun --nodes=2 --nodelist=<db-node-1>,<db-node-2> --ntasks=2" in weaviate


def test_queue_checks_count_one_job(one) -> None:
    cfg = one.config
    assert jobs_held_at_once(cfg.executor, cfg.vdb) == []
    assert per_user_limit_problems(cfg.executor, cfg.vdb) == []


def test_one_allocation_holds_one_block_each(one) -> None:
    from executors.config import SlurmExecutorConfig

    data = one.config.executor.model_dump()
    data["gpu"]["max_blocks"] = 2
    with pytest.raises(ValueError, match=r"gpu\.max_blocks must be 1"):
        SlurmExecutorConfig.model_validate(data)


def test_mpiexec_ranks_go_to_the_database_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.pipeline.test_hpc_render import FIXED_ENV

    for key, value in FIXED_ENV.items():
        monkeypatch.setenv(key, value)
    loaded = load_config(REPO / "configs" / "polaris.yaml")
    cfg = loaded.config
    qdrant = next(s for s in cfg.vdb.databases if s.name == "qdrant")
    cluster = cfg.vdb.cluster.model_copy(update={"nodes": 2, "workers": 8})
    layout = plan_cluster(qdrant, cluster, node_shape(cfg.executor), Path("/w"), loaded.base_dir)
    line = launcher_command(layout, cluster, cfg.executor.node, ["x5", "x6", "x7"])
    assert line.startswith("mpiexec --hosts x5,x6 -n 8 --ppn 4 ")  # only as many as the job asks
