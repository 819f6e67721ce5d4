"""Cores per worker for real: CPU affinity of the servers a local deployment starts, each database's own
thread knobs, ``bind: none``, a clear error when more cores are asked for than exist, and the HPC
launcher's binding under the same names."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from apps.vdb.binding import bind_local, local_cpus
from apps.vdb.cluster.layout import node_shape, plan_cluster
from apps.vdb.cluster.render import launcher_command
from apps.vdb.config import VdbConfig
from apps.vdb.milvus.settings import MilvusSettings
from apps.vdb.qdrant.settings import QdrantSettings
from apps.vdb.weaviate.settings import WeaviateSettings
from core.errors import ConfigError
from pipeline.config.loader import load_config
from tests.conftest import REPO

ALLOWED = sorted(os.sched_getaffinity(0))


def test_cores_are_the_first_allowed_cpus_or_none() -> None:
    assert local_cpus(None, "cores") is None
    assert local_cpus(1, "none") is None
    assert local_cpus(1, "cores") == ALLOWED[:1]
    assert local_cpus(len(ALLOWED), "cores") == ALLOWED


@pytest.mark.parametrize("bind", ["cores", "none"])
def test_more_cores_than_the_machine_has_is_a_clear_error(bind: str) -> None:
    asked = len(ALLOWED) + 1
    with pytest.raises(
        ConfigError,
        match=rf"vdb.cores_per_worker is {asked} but this machine lets the run "
        rf"use {len(ALLOWED)} CPU\(s\)",
    ):
        bind_local(WeaviateSettings(), asked, bind)  # type: ignore[arg-type]


def test_each_database_sets_its_own_thread_knobs_and_a_user_value_wins() -> None:
    weaviate, _ = bind_local(WeaviateSettings(), 1, "cores")
    assert weaviate.gomaxprocs == 1
    assert bind_local(WeaviateSettings(gomaxprocs=3), 1, "cores")[0].gomaxprocs == 3
    milvus, _ = bind_local(MilvusSettings(), 1, "none")
    assert milvus.env == {"GOMAXPROCS": "1"}
    assert bind_local(MilvusSettings(env={"GOMAXPROCS": "4"}), 1, "cores")[0].env == {"GOMAXPROCS": "4"}
    qdrant, cpus = bind_local(QdrantSettings(mode="edge"), 1, "cores")
    assert qdrant.edge_search_threads == 1 and qdrant.max_indexing_threads == 1 and cpus == ALLOWED[:1]
    unchanged, cpus = bind_local(QdrantSettings(), None, "cores")
    assert unchanged == QdrantSettings() and cpus is None


def test_the_config_takes_cores_per_worker_and_bind() -> None:
    cfg = VdbConfig.model_validate(
        {"databases": [{"name": "weaviate"}], "cores_per_worker": 2, "bind": "none"}
    )
    assert (cfg.cores_per_worker, cfg.bind) == (2, "none")
    assert VdbConfig.model_validate({"databases": [{"name": "weaviate"}]}).cores_per_worker is None
    with pytest.raises(ValidationError, match="bind"):
        VdbConfig.model_validate({"databases": [{"name": "weaviate"}], "bind": "socket"})
    with pytest.raises(ValidationError, match="cores_per_worker"):
        VdbConfig.model_validate({"databases": [{"name": "weaviate"}], "cores_per_worker": 0})


def test_hpc_bind_none_says_cpu_bind_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.pipeline.test_hpc_render import FIXED_ENV

    for key, value in FIXED_ENV.items():
        monkeypatch.setenv(key, value)
    loaded = load_config(REPO / "configs" / "polaris.yaml")
    cfg = loaded.config
    qdrant = next(s for s in cfg.vdb.databases if s.name == "qdrant")
    node = node_shape(cfg.executor)
    bound = plan_cluster(qdrant, cfg.vdb.cluster, node, Path("/work/vdb"), loaded.base_dir)
    assert "--cpu-bind list:" in launcher_command(bound, cfg.vdb.cluster, cfg.executor.node)
    unbound_cluster = cfg.vdb.cluster.model_copy(update={"bind": "none"})
    unbound = plan_cluster(qdrant, unbound_cluster, node, Path("/work/vdb"), loaded.base_dir)
    assert all(r.cores == [] for r in unbound.ranks)
    # explicit: PALS's mpiexec would otherwise apply its default binding
    assert " --cpu-bind none " in launcher_command(unbound, unbound_cluster, cfg.executor.node)
    srun_cluster = unbound_cluster.model_copy(update={"launcher": "srun"})
    assert " --cpu-bind=none " in launcher_command(unbound, srun_cluster, cfg.executor.node)


# --- a real server --------------------------------------------------------------------------------------


def _environ(pid: int) -> dict[str, str]:
    return psutil.Process(pid).environ()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("bind", ["cores", "none"])
def test_a_local_weaviate_runs_on_its_cores_with_gomaxprocs(bind: str, tmp_path: Path) -> None:
    """What the run records (server_facts through the deploy task) is what was asked for."""
    from apps.vdb import database
    from pipeline.vdb_stages import deploy

    settings, cpus = bind_local(WeaviateSettings(), 1, bind)  # type: ignore[arg-type]
    deployment = database("weaviate").deployment(settings)
    deployment.cpus = cpus
    try:
        deployed = deploy(deployment, str(tmp_path / "server"), 120)
        [server] = deployed.servers
        expected = ALLOWED[:1] if bind == "cores" else ALLOWED
        assert server.cpus_allowed == expected
        status = Path(f"/proc/{server.pid}/status").read_text()
        allowed_list = next(line for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
        assert allowed_list.split(":")[1].strip() == (
            str(ALLOWED[0]) if bind == "cores" else allowed_list.split(":")[1].strip()
        )
        assert _environ(server.pid)["GOMAXPROCS"] == "1"
        # every thread of the server, not only its first, is on the asked CPUs
        tasks = Path(f"/proc/{server.pid}/task").iterdir()
        assert {tuple(sorted(os.sched_getaffinity(int(t.name)))) for t in tasks} == {tuple(expected)}
    finally:
        deployment.stop()


def test_an_engine_without_thread_knobs_keeps_its_settings_and_is_still_pinned() -> None:
    """pgvector, LanceDB and FAISS declare no with_threads: cores_per_worker pins them, nothing more."""
    from apps.vdb.binding import bind_local
    from apps.vdb.faiss.settings import FaissSettings
    from apps.vdb.pgvector.settings import PgvectorSettings

    for settings in (FaissSettings(), PgvectorSettings()):
        kept, cpus = bind_local(settings, 1, "cores")
        assert kept == settings and cpus == sorted(os.sched_getaffinity(0))[:1]
