"""The local Slurm testbed of scripts/slurm/testbed.sh, for real: four slurmd nodes on this machine, jobs
through srun, sbatch and scancel, and no daemon left running after `stop`, even when a test fails.
The ``testbed`` fixture and its helpers are in conftest.py.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.slurm.conftest import (
    NODES,
    TERMINAL,
    SlurmTestbed,
    _base_env,
    _proc_state,
    _read0,
    _script,
    leftovers,
)

pytestmark = pytest.mark.slow


def test_env_sh_points_clients_at_the_testbed(testbed: SlurmTestbed) -> None:
    env_sh = (testbed.directory / "env.sh").read_text()
    assert f"export SLURM_CONF={testbed.directory}/slurm.conf" in env_sh
    out = subprocess.run(
        ["bash", "-c", f"source {testbed.directory}/env.sh && sinfo -h -N -o '%N %t'"],
        env=_base_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert sorted(out.split()) == sorted([f"node{k}" for k in range(1, NODES + 1)] + ["idle"] * NODES)


def test_srun_spans_three_nodes(testbed: SlurmTestbed) -> None:
    out = testbed.ok("srun", "-N3", "-l", "printenv", "SLURMD_NODENAME")
    ranks = dict(line.split(": ", 1) for line in out.strip().splitlines())
    assert ranks == {"0": "node1", "1": "node2", "2": "node3"}


def test_sbatch_job_across_two_nodes(testbed: SlurmTestbed, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH -N2\n"
        "#SBATCH -J two-nodes\n"
        f"#SBATCH -o {tmp_path}/job-%j.out\n"
        "srun -l printenv SLURMD_NODENAME\n"
        'echo "nodelist=$SLURM_JOB_NODELIST"\n'
    )
    job_id = testbed.ok("sbatch", "--parsable", str(script), cwd=tmp_path).strip().split(";")[0]
    info = testbed.wait_state(job_id, TERMINAL)
    output = (tmp_path / f"job-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", f"{info}\n{output}\n{testbed.logs()}"
    assert info["ExitCode"] == "0:0"
    ranks = dict(line.split(": ", 1) for line in output.splitlines() if ": " in line)
    assert sorted(ranks) == ["0", "1"]
    assert len(set(ranks.values())) == 2, output
    assert "nodelist=node[" in output


def _job_tasks(job_id: str, command: str) -> list[str]:
    """PIDs of live processes named ``command`` that belong to job ``job_id``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or _proc_state(entry.name) in {"Z", "X", "gone"}:
            continue
        try:
            if (entry / "comm").read_text().strip() != command:
                continue
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}" in _read0(f"/proc/{entry.name}/environ"):
            pids.append(entry.name)
    return pids


def test_scancel_ends_a_running_job(testbed: SlurmTestbed, tmp_path: Path) -> None:
    job_id = testbed.ok(
        "sbatch",
        "--parsable",
        "-N1",
        "-J",
        "to-cancel",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 300",
        cwd=tmp_path,
    ).strip()
    testbed.wait_state(job_id, {"RUNNING"}, timeout=30)
    deadline = time.monotonic() + 10
    while not _job_tasks(job_id, "sleep") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _job_tasks(job_id, "sleep"), "the job's sleep task never appeared"

    testbed.ok("scancel", job_id)
    info = testbed.wait_state(job_id, {"CANCELLED"}, timeout=30)
    assert info["JobState"] == "CANCELLED"
    deadline = time.monotonic() + 20
    while _job_tasks(job_id, "sleep") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _job_tasks(job_id, "sleep"), "scancel left the job's task running"
    squeue = testbed.ok("squeue", "-h", "-t", "R", "-j", job_id)
    assert squeue.strip() == ""


def test_stop_leaves_nothing_running(testbed: SlurmTestbed, tmp_path: Path) -> None:
    """Last in this module: stop with a job still running; afterwards no daemon, slurmstepd or task of the
    testbed is alive. (The fixture's finalizer then finds it stopped and checks the same again.)"""
    job_id = testbed.ok(
        "sbatch", "--parsable", "-N2", "-o", "/dev/null", "--wrap", "srun sleep 300", cwd=tmp_path
    ).strip()
    testbed.wait_state(job_id, {"RUNNING"}, timeout=30)
    assert leftovers(testbed.directory), "the testbed should be running before stop"

    stopped = _script("stop", str(testbed.directory))
    assert stopped.returncode == 0, f"{stopped.stdout}\n{stopped.stderr}"
    assert leftovers(testbed.directory) == []
    assert _job_tasks(job_id, "sleep") == []

    status = _script("status", str(testbed.directory))
    assert status.returncode == 3, status.stdout
    again = _script("stop", str(testbed.directory))
    assert again.returncode == 0 and "not running" in again.stdout
