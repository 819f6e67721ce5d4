"""Queue limits read live (qstat -Qf, scontrol show partition), the table fallback, and per-user limits."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from core.errors import ConfigError
from executors.queues import (
    QueueLimitsUnavailable,
    current,
    parse_qstat_qf,
    parse_sacctmgr_qos,
    parse_scontrol_partitions,
    pbs_limits,
    read_live,
    resolve,
    slurm_duration,
    slurm_limits,
    use_queue_limits,
    used_tables,
)
from pipeline.config.checks import check_platform, jobs_held_at_once, per_user_limit_problems
from pipeline.config.loader import load_config
from tests.conftest import REPO, run_cli
from tests.executors.test_hpc_config import hpc_env, study, write  # noqa: F401  (hpc_env: a fixture)

FIXTURES = Path(__file__).parent / "fixtures"
AURORA_QF = FIXTURES / "aurora-qstat-Qf.txt"
POLARIS_QF = FIXTURES / "polaris-qstat-Qf.txt"
SLURM = FIXTURES / "slurm-testbed-scontrol.txt"


def _problems(path: Path, listing: Path | None = None, mode: str = "live") -> dict[tuple, str]:
    loaded = load_config(path)
    with use_queue_limits(mode, listing):  # type: ignore[arg-type]
        return dict(check_platform(loaded.config, loaded.base_dir))


def _edited(tmp_path: Path, source: Path, old: str, new: str) -> Path:
    text = source.read_text()
    assert text.count(old) == 1, old
    path = tmp_path / f"edited-{source.name}"
    path.write_text(text.replace(old, new))
    return path


# --- qstat -Qf ---------------------------------------------------------------------------------------------


def test_qstat_qf_parses_execution_and_route_queues_with_wrapped_values() -> None:
    queues = parse_qstat_qf(AURORA_QF.read_text(), user="someone")
    prod = queues["prod"]
    assert prod.is_route and (prod.min_nodes, prod.max_nodes, prod.max_walltime) == (256, 10624, "24:00:00")
    # the fixture's route_destinations wraps onto a tab-indented line inside 'backfill-large'
    assert prod.route_destinations == [
        "small",
        "medium",
        "large",
        "backfill-small",
        "backfill-medium",
        "backfill-large",
    ]
    assert queues["debug"].attributes["state_count"].endswith("Exiting:0 Begun:0")
    capacity = queues["capacity"]
    assert (capacity.max_run_per_user, capacity.max_queued_per_user) == (2, 5)
    assert capacity.max_run_nodes_per_user is None  # [o:PBS_ALL=512] caps the queue, not a user
    assert queues["small"].max_run_per_user is None  # [p:PBS_GENERIC=10] is per project


def test_route_queue_destinations_become_routes() -> None:
    limits, closed = pbs_limits(parse_qstat_qf(AURORA_QF.read_text()))
    assert closed == {}
    prod = limits["prod"]
    assert [(r.queue, r.min_nodes, r.max_nodes, r.max_walltime) for r in prod.routes[:3]] == [
        ("small", 256, 1024, "12:00:00"),
        ("medium", 1025, 1999, "18:00:00"),
        ("large", 2000, 10624, "24:00:00"),
    ]
    assert prod.route(300).queue == "small" and prod.route(100) is None
    assert "tiny" not in limits and "prod-large" not in limits
    capacity = limits["capacity"]
    assert (capacity.min_nodes, capacity.max_nodes, capacity.max_walltime) == (1, 16, "168:00:00")
    assert capacity.min_walltime == "00:05:00"


@pytest.mark.parametrize(
    ("value", "user", "expected"),
    [
        ("[u:PBS_GENERIC=4]", "bob", 4),
        ("[u:PBS_GENERIC=4],[u:alice=99]", "alice", 99),  # the user's own cell wins, in either order
        ("[u:alice=10,u:PBS_GENERIC=4]", "alice", 10),
        ("[u:alice=10,u:PBS_GENERIC=4]", "bob", 4),
        ("[o:PBS_ALL=512]", "bob", None),
        ("[g:PBS_GENERIC=3],[p:PBS_GENERIC=10]", "bob", None),
    ],
)
def test_per_user_cells_of_pbs_limit_tables(value: str, user: str, expected: int | None) -> None:
    text = f"Queue: q\n    queue_type = Execution\n    max_run = {value}\n    enabled = True\n"
    assert parse_qstat_qf(text, user=user)["q"].max_run_per_user == expected


def test_old_style_limits_nodes_and_closed_queues() -> None:
    text = (
        "Queue: old\n    queue_type = Execution\n    max_user_run = 3\n    max_user_queuable = 7\n"
        "    resources_max.nodes = 8\n    resources_max.walltime = 1800\n    enabled = True\n\n"
        "Queue: shut\n    queue_type = Execution\n    resources_max.nodect = 4\n    enabled = False\n"
        "    started = True\n\nQueue: stopped\n    queue_type = Execution\n    started = False\n"
    )
    limits, closed = pbs_limits(parse_qstat_qf(text))
    old = limits["old"]
    assert (old.max_running_per_user, old.max_queued_per_user, old.max_nodes) == (3, 7, 8)
    assert old.max_walltime == "00:30:00"
    assert closed == {"shut": "enabled = False", "stopped": "started = False"}


# --- scontrol show partition, sacctmgr ---------------------------------------------------------------------


def test_scontrol_capture_of_the_testbed() -> None:
    limits, closed = slurm_limits(parse_scontrol_partitions(SLURM.read_text()))
    debug = limits["debug"]
    # MinNodes=0 -> 1; MaxNodes=UNLIMITED -> the partition's TotalNodes=4; MaxTime=UNLIMITED -> none
    assert (debug.min_nodes, debug.max_nodes, debug.max_walltime) == (1, 4, None)
    assert closed == {}


def test_scontrol_oneliner_limits_and_down_partitions() -> None:
    text = (
        "PartitionName=gpu MinNodes=2 MaxNodes=16 MaxTime=2-00:00:00 State=UP TotalNodes=64 QoS=gpuqos\n"
        "PartitionName=maint MinNodes=1 MaxNodes=UNLIMITED MaxTime=30:00 State=DOWN TotalNodes=4\n"
    )
    parts = parse_scontrol_partitions(text)
    limits, closed = slurm_limits(parts, parse_sacctmgr_qos("gpuqos|2|10\nnormal||\n"))
    gpu = limits["gpu"]
    assert (gpu.min_nodes, gpu.max_nodes, gpu.max_walltime) == (2, 16, "48:00:00")
    assert (gpu.max_running_per_user, gpu.max_queued_per_user) == (2, 10)
    assert closed == {"maint": "State=DOWN"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("1-00:00:00", "24:00:00"),
        ("2-12", "60:00:00"),
        ("7-00:30", "168:30:00"),
        ("12:00:00", "12:00:00"),
        ("30:00", "00:30:00"),
        ("45", "00:45:00"),
        ("365-00:00:00", None),  # beyond a walltime field's 999 h: no limit in practice
    ],
)
def test_slurm_durations(value: str, expected: str | None) -> None:
    assert slurm_duration(value) == expected


# --- live, table or auto -----------------------------------------------------------------------------------


def _stub(returncode: int = 0, stdout: str = "", delay: bool = False):
    def runner(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        if delay:
            raise subprocess.TimeoutExpired(argv, kwargs.get("timeout"))
        return subprocess.CompletedProcess(argv, returncode, stdout, "qstat: cannot connect to server")

    return runner


def test_read_live_reports_why_it_cannot() -> None:
    with pytest.raises(QueueLimitsUnavailable, match=r"qstat -Qf did not answer in 5 s"):
        read_live("aurora", runner=_stub(delay=True))
    with pytest.raises(QueueLimitsUnavailable, match=r"qstat -Qf failed \(exit 2: qstat: cannot connect"):
        read_live("polaris", runner=_stub(returncode=2))
    table = read_live("polaris", runner=_stub(stdout=POLARIS_QF.read_text()))
    assert table.live and table.source.startswith("live from qstat -Qf on ")
    assert table.limits["capacity"].max_running_per_user == 1


def test_auto_falls_back_to_the_dated_table_and_live_refuses(
    hpc_env: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", str(hpc_env))  # no qstat here
    executor = load_config(REPO / "configs" / "aurora.yaml").config.executor
    table = resolve(executor, "auto")
    assert not table.live and table.source == "the config's table of 2026-08 (qstat not found)"
    assert resolve(executor, "table").source == "the config's table of 2026-08 (--queue-limits table)"
    with pytest.raises(ConfigError, match="queue limits cannot be read live: qstat not found"):
        resolve(executor, "live")
    assert current(executor).source == "the config's table of 2026-08"  # outside a choice: the table
    with use_queue_limits("live", AURORA_QF):
        assert current(executor).live and set(used_tables()) == {"aurora"}


# --- the study configs against the recorded current limits -------------------------------------------------


@pytest.mark.parametrize(("platform", "listing"), [("aurora", AURORA_QF), ("polaris", POLARIS_QF)])
def test_study_configs_pass_against_the_current_limits(
    hpc_env: Path,  # noqa: F811
    platform: str,
    listing: Path,
) -> None:
    from pipeline.plan import build_plan

    path = REPO / "configs" / f"{platform}.yaml"
    assert _problems(path, listing) == {}
    assert _problems(path, mode="table") == {}  # the table says the same as the listing
    with use_queue_limits("live", listing):
        build_plan(load_config(path))


def test_aurora_fails_against_a_smaller_node_limit_naming_job_and_limit(hpc_env: Path) -> None:  # noqa: F811
    smaller = _edited(hpc_env, AURORA_QF, "resources_max.nodect = 16\n", "resources_max.nodect = 8\n")
    problems = _problems(REPO / "configs" / "aurora.yaml", smaller)
    assert problems[("executor", "gpu", "nodes_per_block")] == (
        "queue 'capacity' accepts 1-8 nodes per job, not 16"
    )
    assert ("executor", "cpu", "nodes_per_block") not in problems  # 8 nodes still fit


def test_polaris_fails_against_a_shorter_routed_walltime(hpc_env: Path) -> None:  # noqa: F811
    head, small = POLARIS_QF.read_text().split("Queue: small\n", 1)  # small's walltime: 3 h -> 2 h
    shorter = hpc_env / "shorter-small.txt"
    small = small.replace("walltime = 03:00:00", "walltime = 02:00:00", 1)
    shorter.write_text(f"{head}Queue: small\n{small}")
    message = _problems(REPO / "configs" / "polaris.yaml", shorter)[("executor", "walltime")]
    assert "-node jobs to 'small' (10-24 nodes), which grants at most 02:00:00, not 03:00:00" in message


def test_a_queue_the_scheduler_does_not_list(hpc_env: Path) -> None:  # noqa: F811
    data = study("polaris")
    data["executor"]["queue"] = "nosuchqueue"
    problems = _problems(write(hpc_env, data), POLARIS_QF)
    assert problems[("executor", "queue")].startswith(
        "queue 'nosuchqueue' is not among the queues qstat -Qf lists (backfill-large"
    )


# --- per-user limits -------------------------------------------------------------------------------------


def test_jobs_held_at_once_are_the_client_block_one_pilot_and_kept_blocks(hpc_env: Path) -> None:  # noqa: F811
    data = study("polaris")
    data["vdb"]["databases"] = data["vdb"]["databases"][:2]
    data["vdb"].pop("sweep")
    cfg = load_config(write(hpc_env, data)).config
    sets = jobs_held_at_once(cfg.executor, cfg.vdb)
    assert [[(j.name, j.running, j.queued) for j in held] for held in sets] == [
        [("executor.gpu", 0, 2), ("executor.cpu", 1, 1), ("vdb qdrant pilot", 1, 1)],
        [("executor.gpu", 0, 2), ("executor.cpu", 1, 1), ("vdb milvus pilot", 1, 1)],
    ]
    data["executor"]["gpu"]["min_blocks"] = 1  # a block Parsl keeps while idle is held too
    cfg = load_config(write(hpc_env, data)).config
    assert jobs_held_at_once(cfg.executor, cfg.vdb)[0][0].running == 1


def test_per_user_running_limit_names_queue_limit_and_jobs(hpc_env: Path) -> None:  # noqa: F811
    data = study("polaris")
    for route in data["executor"]["queues"]["prod"]["routes"]:
        route["max_running_per_user"] = 1
    loaded = load_config(write(hpc_env, data))
    problems = check_platform(loaded.config, loaded.base_dir)
    assert (
        ("vdb", "cluster", "queue"),
        "queue 'prod' (routed to 'small') runs at most 1 job per user; this run holds 2 at once "
        "(executor.cpu, vdb qdrant pilot): use one allocation (executor.allocation: one)",
    ) in problems


def test_per_user_limits_of_debug_scaling_and_capacity(hpc_env: Path) -> None:  # noqa: F811
    data = study("aurora")
    data["executor"]["gpu"]["min_blocks"] = 1
    cfg = load_config(write(hpc_env, data)).config
    with use_queue_limits("live", AURORA_QF):
        problems = per_user_limit_problems(cfg.executor, cfg.vdb.model_copy(update={"swept": False}))
    texts = [message for _, message in problems]
    assert (
        "queue 'capacity' runs at most 2 jobs per user; this run holds 3 at once "
        "(executor.gpu, executor.cpu, vdb qdrant pilot): use one allocation (executor.allocation: one)"
    ) in texts
    data = study("aurora")
    data["executor"]["cpu"]["max_blocks"] = 3  # 2 GPU + 3 CPU blocks + a pilot: over capacity's 5 queued
    cfg = load_config(write(hpc_env, data)).config
    with use_queue_limits("live", AURORA_QF):
        problems = per_user_limit_problems(cfg.executor, cfg.vdb.model_copy(update={"swept": False}))
    assert any(
        "queue 'capacity' queues at most 5 jobs per user; this run may submit 6 at once "
        "(executor.gpu x2, executor.cpu x3, vdb qdrant pilot)" in message
        for _, message in problems
    )


# --- the command line --------------------------------------------------------------------------------------


def test_plan_says_which_limits_it_used(hpc_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    result = run_cli("validate", "configs/aurora.yaml", "--queue-listing", str(AURORA_QF), timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"queue limits: live from qstat -Qf recorded in {AURORA_QF}" in result.stdout
    # a qstat on PATH that answers: read live on this host
    bin_dir = hpc_env / "bin"
    bin_dir.mkdir()
    (bin_dir / "qstat").write_text(f"#!/bin/sh\ncat '{POLARIS_QF}'\n")
    (bin_dir / "qstat").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = run_cli("validate", "configs/polaris.yaml", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "queue limits: live from qstat -Qf on " in result.stdout
    result = run_cli("validate", "configs/polaris.yaml", "--queue-limits", "table", timeout=300)
    assert "queue limits: the config's table of 2026-08 (--queue-limits table)" in result.stdout
    smaller = _edited(hpc_env, AURORA_QF, "resources_max.nodect = 16\n", "resources_max.nodect = 8\n")
    result = run_cli("plan", "configs/aurora.yaml", "--queue-listing", str(smaller), timeout=300)
    assert result.returncode == 2
    assert "executor.gpu.nodes_per_block: queue 'capacity' accepts 1-8 nodes per job, not 16" in result.stderr
