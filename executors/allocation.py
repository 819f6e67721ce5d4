"""One allocation: the whole run inside one batch job, for queues whose per-user limits cannot hold the
separate jobs at once (Aurora's ``capacity`` runs 2 per user, either site's ``debug-scaling`` 1).

With ``executor.allocation: one`` the user submits one job (``plan`` prints its script, ``job-allocation.sh``)
whose batch script runs ``python -m pipeline run`` on the job's first node. The driver splits the job's
nodes in order: the GPU block's, then the CPU block's, then the database ranks'. Parsl's blocks start
with a ``LocalProvider`` whose launcher reaches only their nodes (``srun --nodelist`` on Slurm; a node file
of their own for ``mpiexec`` on PBS), and each database's pilot runs its launcher command the same way
(:func:`apps.vdb.cluster.provider.cluster_provider`). Lifecycle, driver lease and teardown are the
pilot's own; the scheduler ends whatever is left when the job ends.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError

HOST = re.compile(
    r"[A-Za-z0-9<][A-Za-z0-9._<>-]{0,252}"
)  # a node name (placeholders such as <db-node-1> in a plan)


@dataclass(frozen=True)
class NodeSplit:
    """The job's nodes by role, in the job's own order."""

    gpu: list[str]
    cpu: list[str]
    databases: list[str]


def in_one_allocation(executor: Any) -> bool:
    """True when the run is one batch job (``executor.allocation: one``; the local platform never is)."""
    return getattr(executor, "allocation", "separate") == "one"


def job_walltime(executor: Any, job: Any) -> str:
    """The walltime of the job a worker block or a database cluster (``job``) runs in: its own (else the
    executor's), or under ``allocation: one`` the one job's (a job's own walltime does not apply in it)."""
    return executor.walltime if in_one_allocation(executor) else job.walltime or executor.walltime


def job_walltime_field(executor: Any, job: Any, own: tuple[str, ...]) -> tuple[str, ...]:
    """The config field :func:`job_walltime` takes its value from: ``own`` (the job's own field), or
    ``executor.walltime``."""
    return own if job.walltime and not in_one_allocation(executor) else ("executor", "walltime")


def nodes_needed(executor: Any, vdb: Any) -> tuple[int, int, int]:
    """(GPU block, CPU block, database) nodes of one allocation: the largest database job of any point."""
    cpu = executor.cpu.nodes_per_block if executor.cpu is not None else 0
    databases = 0
    cluster = getattr(vdb, "cluster", None) if vdb else None
    if cluster is not None:
        clusters = [p.config.cluster.for_database(p.database) for p in vdb.points if p.config.cluster]
        clusters += [cluster.for_database(db.name) for db in vdb.pilot_databases()]
        databases = max((c.nodes for c in clusters), default=0)
    return executor.gpu.nodes_per_block, cpu, databases


def job_hosts(env: Mapping[str, str] | None = None) -> list[str]:
    """The nodes of the batch job this process runs in, in the scheduler's order (first: this one).

    Slurm: ``scontrol show hostnames $SLURM_JOB_NODELIST``; PBS: the distinct lines of ``$PBS_NODEFILE``.
    """
    env = os.environ if env is None else env
    if env.get("SLURM_JOB_NODELIST"):
        done = subprocess.run(
            ["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            raise ConfigError(f"executor.allocation one: scontrol cannot list the job's nodes: {done.stderr}")
        return done.stdout.split()
    if env.get("PBS_NODEFILE"):
        lines = Path(env["PBS_NODEFILE"]).read_text().split()
        return list(dict.fromkeys(lines))
    raise ConfigError(
        "executor.allocation one: this run is not inside a batch job (neither SLURM_JOB_NODELIST nor "
        "PBS_NODEFILE is set); submit the job script `plan` prints as job-allocation.sh"
    )


def split_hosts(executor: Any, vdb: Any, hosts: list[str]) -> NodeSplit:
    """The job's ``hosts`` divided among the GPU block, the CPU block and the databases (the rest)."""
    gpu, cpu, databases = nodes_needed(executor, vdb)
    if len(hosts) < gpu + cpu + databases:
        raise ConfigError(
            f"executor.allocation one: the job has {len(hosts)} node(s), the run needs "
            f"{gpu + cpu + databases} ({gpu} GPU block, {cpu} CPU block, {databases} database)"
        )
    return NodeSplit(hosts[:gpu], hosts[gpu : gpu + cpu], hosts[gpu + cpu :])


def current_split(executor: Any, vdb: Any) -> NodeSplit:
    """The split of the job this process runs in."""
    return split_hosts(executor, vdb, job_hosts())


def restrict_to(platform: str, role: str, hosts: list[str], run_dir: Path) -> tuple[str, str]:
    """(a ``worker_init`` line, launcher options) that keep one role's launches on its ``hosts``.

    Slurm: ``srun --nodes --nodelist``. PBS: Parsl's MpiExecLauncher reads ``$PBS_NODEFILE``, so the
    role gets a node file of its own (written by the job's shell: rendering a plan writes nothing).
    """
    bad = [h for h in hosts if not HOST.fullmatch(h)]
    if bad:
        raise ConfigError(
            f"executor.allocation one: the scheduler named a node {bad[0]!r} that is no host name"
        )
    if platform == "slurm":
        # Parsl's SrunLauncher names its command file after $SLURM_JOB_NAME, in a directory all blocks
        # share: inside one job each role needs its own name, or one block runs the other's workers.
        return f"export SLURM_JOB_NAME=pes2o-{role}", f"--nodes={len(hosts)} --nodelist={','.join(hosts)}"
    path = shlex.quote(str(run_dir / "allocation" / f"{role}.nodes"))
    names = " ".join(shlex.quote(h) for h in hosts)
    return f"mkdir -p $(dirname {path}) && printf '%s\\n' {names} > {path} && export PBS_NODEFILE={path}", ""


def end_steps(env: Mapping[str, str] | None = None, wait_s: float = 60.0) -> None:
    """Inside a Slurm job: SIGTERM every step of the run's own job but its batch script (the driver), and
    wait for them to end, before Parsl cancels its blocks.

    Parsl cancels a block by signalling its ``srun``, which kills the step outright: the multiprocessing
    resource trackers of its workers die with them and their semaphores stay in /dev/shm. A SIGTERM lets
    the workers end and their trackers (which ignore it) clean up, as when a separate block job ends.
    """
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        return
    try:
        subprocess.run(["scancel", "--signal=TERM", job], capture_output=True, timeout=30, check=False)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            listed = subprocess.run(
                ["squeue", "-h", "-s", "-j", job, "-o", "%i"], capture_output=True, text=True, timeout=30
            )
            steps = [s for s in listed.stdout.split() if not s.endswith((".batch", ".extern"))]
            if listed.returncode != 0 or not steps:
                return
            time.sleep(1.0)
    except (OSError, subprocess.SubprocessError):
        return  # the scheduler's own teardown still ends them with the job
