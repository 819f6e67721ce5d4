"""The local Slurm testbed (scripts/slurm/testbed.sh) as a module-scoped fixture: each test module that asks
for ``testbed`` gets its own four-node testbed, stopped at the module's end even when a test fails.

Where Slurm is missing, the fixture installs it when it runs as root (`testbed.sh install`). Where it can't
(not root, Slurm missing) the tests are skipped with the reason, except under CI=true, where that fails the
run: the testbed is never skipped silently in CI. A testbed that is installed but does not start fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

NODES = 4
COMMANDS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scancel", "squeue", "scontrol", "sinfo")
TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
}


def _find_script() -> Path:
    """scripts/slurm/testbed.sh of the repository holding this file (it may sit in tests/ or beside it)."""
    for parent in Path(__file__).resolve().parents:
        script = parent / "scripts" / "slurm" / "testbed.sh"
        if script.is_file():
            return script
    raise FileNotFoundError("scripts/slurm/testbed.sh not found above " + str(Path(__file__).parent))


SCRIPT = _find_script()


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def _cannot(reason: str) -> None:
    """The testbed cannot be had here: fail under CI=true, else skip; either way with the reason."""
    if _in_ci():
        pytest.fail(f"CI=true and the Slurm testbed cannot start: {reason}", pytrace=False)
    pytest.skip(f"Slurm testbed unavailable: {reason}")


def _base_env() -> dict[str, str]:
    """This process's environment without any SLURM_* variable (a caller may itself run inside a job)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


def _script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = _base_env() | {"SLURM_TESTBED_NODES": str(NODES)}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _ensure_installed() -> None:
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"  # the daemons live in sbin
    missing = [c for c in COMMANDS if shutil.which(c, path=path) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        _cannot(f"Slurm is not installed (missing {', '.join(missing)}) and installing it needs root")
    done = _script("install", timeout=900)
    if done.returncode != 0:
        _cannot(f"`testbed.sh install` failed:\n{done.stdout}\n{done.stderr}")


def _proc_state(pid: str) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split()[1]
    except OSError:
        pass
    return "gone"


def _read0(path: str) -> list[str]:
    try:
        return Path(path).read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def leftovers(directory: Path) -> list[str]:
    """Live (not zombie) processes of the testbed in ``directory``: its slurmctld, slurmd and munged (their
    command line names a file under it), its slurmstepd (SLURM_TESTBED_DIR in their environment) and the
    tasks of its jobs (SLURM_JOB_ID set and SLURM_CONF pointing at its slurm.conf)."""
    d = str(directory)
    conf = f"SLURM_CONF={d}/slurm.conf"
    found = []
    for entry in Path("/proc").iterdir():
        pid = entry.name
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if _proc_state(pid) in {"Z", "X", "gone"}:
            continue
        cmdline = " ".join(_read0(f"/proc/{pid}/cmdline"))
        if comm in {"slurmctld", "slurmd", "munged"} and f"{d}/" in cmdline:
            found.append(f"{pid} {cmdline}")
            continue
        environ = _read0(f"/proc/{pid}/environ")
        if comm == "slurmstepd" and f"SLURM_TESTBED_DIR={d}" in environ:
            found.append(f"{pid} {cmdline}")
        elif conf in environ and any(v.startswith("SLURM_JOB_ID=") for v in environ):
            found.append(f"{pid} {cmdline} (job task)")
    return found


@dataclass
class SlurmTestbed:
    directory: Path
    env: dict[str, str]

    def run(
        self, *cmd: str, timeout: float = 60, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(cmd),
            env=self.env,
            cwd=cwd or self.directory,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, *cmd: str, timeout: float = 60, cwd: Path | None = None) -> str:
        done = self.run(*cmd, timeout=timeout, cwd=cwd)
        assert done.returncode == 0, (
            f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict ({} once the job record is gone)."""
        done = self.run("scontrol", "show", "job", "-o", job_id)
        if done.returncode != 0:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", done.stdout))

    def wait_state(self, job_id: str, states: set[str], timeout: float = 60) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not in {sorted(states)} after {timeout}s: {info}\n{self.logs()}")

    def assert_queue_drains(self, timeout: float = 60) -> None:
        """Every job leaves the queue within ``timeout``.

        A cancelled job stays listed as completing (``CG``) until slurmd has reaped its processes and
        run its epilog, a few seconds after the run that cancelled it has exited; only ``CG`` may linger.
        """
        deadline = time.monotonic() + timeout
        queue = self.ok("squeue", "-h", "-o", "%i %j %T")
        while queue.strip() and time.monotonic() < deadline:
            states = {line.split()[-1] for line in queue.strip().splitlines()}
            assert states <= {"COMPLETING"}, f"jobs still queued or running:\n{queue}"
            time.sleep(0.5)
            queue = self.ok("squeue", "-h", "-o", "%i %j %T")
        assert queue.strip() == "", f"jobs still completing after {timeout}s:\n{queue}"

    def logs(self) -> str:
        parts = []
        for log in sorted((self.directory / "log").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-10:]
            parts.append(f"--- {log.name} ---\n" + "\n".join(lines))
        return "\n".join(parts)


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmTestbed]:
    _ensure_installed()
    directory = tmp_path_factory.mktemp("slurm-testbed")
    try:
        started = _script("start", str(directory))
        assert started.returncode == 0, f"testbed.sh start failed:\n{started.stdout}\n{started.stderr}"
        yield SlurmTestbed(directory, _base_env() | {"SLURM_CONF": str(directory / "slurm.conf")})
    finally:
        # Always, whatever happened above: stop every daemon, and fail the teardown if any survives.
        stopped = _script("stop", str(directory))
        left = leftovers(directory)
        assert stopped.returncode == 0 and not left, (
            f"testbed.sh stop exited {stopped.returncode}:\n{stopped.stdout}\n{stopped.stderr}\nleft: {left}"
        )
