"""The Milvus adapter against the real Milvus 2.3.5 standalone server (PyPI ``milvus``), via pymilvus."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml
from pydantic import ValidationError
from pymilvus.grpc_gen.milvus_pb2 import SearchRequest

from apps.interchange.vecs import read_vecs
from apps.vdb import database
from apps.vdb.base import CollectionSpec, DatabaseError, Endpoint, Endpoints
from apps.vdb.milvus.client import MilvusVectorClient
from apps.vdb.milvus.deploy import MilvusDeployment, write_config
from apps.vdb.milvus.settings import MilvusSettings
from apps.vdb.process import free_ports
from tests.conftest import SHARED

DATA = SHARED / "ann" / "fmnist1k"
MILVUS = database("milvus")


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean |found top-k ∩ exact top-k| / k over the queries."""
    return float(np.mean([len(set(f[:k]) & set(t[:k])) / k for f, t in zip(found, truth, strict=True)]))


@pytest.fixture(scope="module")
def fmnist() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fmnist1k base (1000x784), queries (500x784) and exact L2 ground truth (500x100)."""
    return (
        read_vecs(DATA / "fmnist1k_base.fvecs"),
        read_vecs(DATA / "fmnist1k_query.fvecs"),
        read_vecs(DATA / "fmnist1k_groundtruth.ivecs"),
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MilvusSettings, Endpoints]]:
    """One real Milvus server for the module; always stopped, and checked to be gone."""
    # fmnist1k is one 1000-row segment: below Milvus's default 1024 rows it would not be indexed at all.
    settings = MilvusSettings(name="milvus", min_segment_rows_to_index=100)
    deployment = MILVUS.deployment(settings)
    try:
        endpoints = deployment.start(tmp_path_factory.mktemp("milvus"), timeout=180)
        proc = deployment.proc
        yield settings, endpoints
    finally:
        deployment.stop()
    assert proc is not None and proc.proc is not None and proc.proc.poll() is not None


@pytest.fixture
def client(server: tuple[MilvusSettings, Endpoints]) -> Iterator[MilvusVectorClient]:
    settings, endpoints = server
    client = MILVUS.client(settings, endpoints)
    yield client
    client.close()


def load(client: MilvusVectorClient, base: np.ndarray, batch: int = 250) -> np.ndarray:
    """Insert ``base`` in batches keyed by row id; return the ids."""
    ids = np.arange(len(base), dtype=np.int64)
    for start in range(0, len(base), batch):
        client.insert(ids[start : start + batch], base[start : start + batch])
    return ids


@pytest.mark.slow
def test_hnsw_recall_against_exact_ground_truth(server, client, fmnist) -> None:
    base, queries, truth = fmnist
    assert server[1].server_version.startswith("v2.3.5")
    spec = CollectionSpec(
        name="fm_hnsw", dim=784, metric="l2", index_type="hnsw", hnsw_m=16, ef_construction=128
    )
    client.create_collection(spec, recreate=True)
    load(client, base)
    client.wait_searchable(len(base), timeout=60)
    # Deferred indexing: before the build the upload index is FLAT, so search is exact.
    assert client.describe().details["index_type"] == "FLAT"
    assert recall_at_k(client.search(queries[:20], k=10, ef=None).ids, truth[:20], 10) == 1.0

    client.build_index(timeout=120)
    result = client.search(queries, k=10, ef=64)
    assert result.ids.shape == (500, 10) and result.ids.dtype == np.int64
    assert recall_at_k(result.ids, truth, 10) >= 0.9
    assert np.all(np.diff(result.scores, axis=1) >= 0)  # L2 distances, nearest first

    stats = client.describe()
    assert stats.count == 1000 and stats.segments is not None and stats.segments >= 1
    assert stats.details["index_type"] == "HNSW" and stats.details["indexed_rows"] >= 1000
    assert stats.disk_bytes is not None and stats.disk_bytes > base.nbytes


@pytest.mark.slow
def test_ivf_flat_recall(client, fmnist) -> None:
    base, queries, truth = fmnist
    spec = CollectionSpec(name="fm_ivf", dim=784, metric="l2", index_type="ivf_flat", ivf_nlist=32)
    client.create_collection(spec, recreate=True)
    load(client, base, batch=500)
    client.wait_searchable(len(base), timeout=60)
    client.build_index(timeout=120)
    assert client.describe().details["index_type"] == "IVF_FLAT"
    assert recall_at_k(client.search(queries, k=10, ef=8).ids, truth, 10) >= 0.9  # ef is nprobe
    # One probed list of 32 misses neighbours: proof that the IVF index, not a brute-force scan, answered.
    assert recall_at_k(client.search(queries, k=10, ef=1).ids, truth, 10) < 0.9


@pytest.mark.slow
def test_retried_batch_does_not_duplicate(client, fmnist) -> None:
    base = fmnist[0][:300]
    spec = CollectionSpec(name="fm_retry", dim=784, metric="cosine", index_type="hnsw")
    client.create_collection(spec, recreate=True)
    ids = load(client, base, batch=100)
    client.insert(ids[100:200], base[100:200])  # the retry of a batch whose reply was lost
    client.wait_searchable(300, timeout=60)
    assert client.count() == 300
    client.build_index(timeout=120)
    client.insert(ids[:100], base[:100])  # retried after indexing too
    client.wait_searchable(300, timeout=60)
    assert client.count() == 300
    # Missing rows are reported, not waited for forever.
    with pytest.raises(DatabaseError, match=r"300 rows visible .* expected 301 \(1 missing\)"):
        client.wait_searchable(301, timeout=1)


@pytest.mark.slow
def test_plain_inserts_store_the_vectors_exactly_and_retries_do_not_duplicate(client, fmnist) -> None:
    base = fmnist[0][:300]
    client.create_collection(CollectionSpec(name="fm_new", dim=784, metric="l2"), recreate=True)
    ids = np.arange(300, dtype=np.int64)
    client.insert_new(ids[:256], base[:256])
    assert client._template not in (None, False)  # the packed request was built and sent
    client._template = False  # a pymilvus without those internals: MilvusClient.insert
    client.insert_new(ids[256:], base[256:])
    client.insert(ids[250:260], base[250:260])  # a retry upserts
    client.wait_searchable(300, timeout=60)
    assert client.count() == 300
    rows = client.client.query(
        "fm_new", filter="id in [0, 255, 299]", output_fields=["id", "vector"], consistency_level="Strong"
    )
    assert sorted(r["id"] for r in rows) == [0, 255, 299]
    for row in rows:
        np.testing.assert_array_equal(np.asarray(row["vector"], np.float32), base[row["id"]])


def _recording_search(client: MilvusVectorClient, monkeypatch) -> list:
    """Record the (request, metadata) of every Search RPC the client's pymilvus connection sends."""
    stub = client.client._get_connection()._stub
    sent, real = [], stub.Search

    def search(request, **kwargs):
        sent.append(
            (request.SerializeToString(), [m for m in kwargs.get("metadata") or [] if "msec" not in m[0]])
        )
        return real(request, **kwargs)

    monkeypatch.setattr(stub, "Search", search)
    return sent


@pytest.mark.slow
@pytest.mark.parametrize(("metric", "index_type"), [("cosine", "hnsw"), ("l2", "flat")])
def test_packed_search_matches_the_public_call(client, fmnist, metric, index_type, monkeypatch) -> None:
    """The packed search sends pymilvus's request byte for byte and returns the same ids and distances."""
    base, queries, _ = fmnist
    name = f"fm_fast_{metric}"
    client.create_collection(
        CollectionSpec(name=name, dim=784, metric=metric, index_type=index_type), recreate=True
    )
    client.insert_new(np.arange(len(base)), base)
    client.wait_searchable(len(base), timeout=60)
    client.build_index(timeout=120)
    sent = _recording_search(client, monkeypatch)
    for batch, n in ((1, 300), (8, 200)):
        for start in range(0, n, batch):
            rows = queries[start : start + batch]
            client._search_template = False  # the public MilvusClient.search
            public = client.search(rows, k=10, ef=32)
            client._search_template = None if client._search_template is False else client._search_template
            packed = client.search(rows, k=10, ef=32)
            assert client._search_template not in (None, False)  # the packed path answered
            assert sent[-1] == sent[-2], f"requests differ for queries {start}..{start + batch}"
            np.testing.assert_array_equal(packed.ids, public.ids)
            np.testing.assert_array_equal(packed.scores, public.scores)
            assert packed.ids.dtype == public.ids.dtype and packed.scores.dtype == public.scores.dtype
    assert len(sent) == 2 * (300 + 200 // 8)
    # Distances as pymilvus reports them: L2 ascending from the nearest, cosine similarity descending.
    order = np.diff(packed.scores, axis=1)
    assert np.all(order >= 0) if metric == "l2" else np.all(order <= 0)


@pytest.mark.slow
def test_packed_search_request_is_byte_identical_at_every_consistency_level(
    client, fmnist, monkeypatch
) -> None:
    """Same timestamp and fields as MilvusClient.search sends; without the internals, the public call."""
    base, queries, _ = fmnist
    client.create_collection(CollectionSpec(name="fm_levels", dim=784), recreate=True)
    client.insert_new(np.arange(len(base)), base)  # Session's timestamp is this client's last write
    client.wait_searchable(len(base), timeout=60)
    client.build_index(timeout=120)
    sent = _recording_search(client, monkeypatch)
    for level in ("Strong", "Bounded", "Session", "Eventually"):
        client.settings.consistency_level = level
        for k, ef in ((10, 32), (5, 200)):
            client._search_template = False
            public = client.search(queries[:3], k=k, ef=ef)
            client._search_template = None
            packed = client.search(queries[:3], k=k, ef=ef)
            key = (k, repr({"metric_type": "COSINE", "params": {"ef": ef}}), level)
            assert client._search_template[0][2:] == key
            assert sent[-1] == sent[-2], f"{level}, k={k}: requests differ"
            ts = SearchRequest.FromString(sent[-1][0]).guarantee_timestamp
            assert ts > 2**18 if level == "Session" else ts in (0, 1, 2)  # Session: the insert's hybrid ts
            np.testing.assert_array_equal(packed.ids, public.ids)

    # A pymilvus without the internals the packed path uses: the public call, from then on.
    def gone(*args: object) -> None:
        raise AttributeError("no _get_connection")

    monkeypatch.setattr(client, "_search_template_for", gone)
    client._search_template = None
    fallback = client.search(queries[:3], k=5, ef=200)
    assert client._search_template is False and len(sent) == 17
    np.testing.assert_array_equal(fallback.ids, packed.ids)


@pytest.mark.slow
def test_dimension_mismatch(server, client, fmnist) -> None:
    client.create_collection(CollectionSpec(name="fm_dim", dim=784), recreate=True)
    other = MILVUS.client(*server)  # another worker attaching with a dataset of another dimension
    try:
        with pytest.raises(DatabaseError, match=r"dimension 784.*dimension 768"):
            other.create_collection(CollectionSpec(name="fm_dim", dim=768))
        with pytest.raises(DatabaseError, match="collection dimension is 784"):
            client.search(np.zeros((2, 768), dtype=np.float32), k=10, ef=None)
        other.create_collection(CollectionSpec(name="fm_dim", dim=768), recreate=True)
        other.insert(np.arange(2), np.ones((2, 768), dtype=np.float32))
        other.wait_searchable(2, timeout=60)
    finally:
        other.close()


@pytest.mark.slow
def test_attach_to_existing_server_by_uri(server, tmp_path: Path, monkeypatch) -> None:
    node = server[1].nodes[0]
    password = Path(str(node.extra["password_file"])).read_text().strip()
    # the credentials come from the variable token_env names: a value in the config would be in provenance
    settings = MilvusSettings(uri=f"http://{node.host}:{node.port}", token_env="MILVUS_TEST_TOKEN")
    monkeypatch.delenv("MILVUS_TEST_TOKEN", raising=False)
    with pytest.raises(DatabaseError, match="token_env names MILVUS_TEST_TOKEN, which is not set"):
        MilvusDeployment(settings).start(tmp_path, timeout=30)
    monkeypatch.setenv("MILVUS_TEST_TOKEN", f"root:{password}")
    attached = MilvusDeployment(settings)
    endpoints = attached.start(tmp_path, timeout=30)
    assert endpoints.server_version == server[1].server_version and endpoints.nodes[0].port == node.port
    attached.stop()  # started nothing, so stops nothing
    assert not list(tmp_path.iterdir())
    other = MILVUS.client(settings, endpoints)
    try:
        other.create_collection(CollectionSpec(name="by_uri", dim=4), recreate=True)
        other.insert(np.arange(5), np.ones((5, 4), dtype=np.float32))
        other.wait_searchable(5, timeout=60)
        assert other.describe().disk_bytes is None  # no data_dir given for an external server
    finally:
        other.close()


@pytest.mark.slow
def test_failed_start_shows_log_tail(tmp_path: Path) -> None:
    fake = tmp_path / "milvus"
    fake.write_text("#!/bin/sh\necho 'failed to open configs/milvus.yaml: bogus'\nexit 3\n")
    fake.chmod(0o755)
    deployment = MilvusDeployment(MilvusSettings(binary=str(fake)))
    try:
        with pytest.raises(
            DatabaseError, match=r"(?s)exited with code 3.*failed to open configs/milvus.yaml"
        ):
            deployment.start(tmp_path / "work", timeout=30)
    finally:
        deployment.stop()
    with pytest.raises(DatabaseError, match="does not exist or is not executable"):
        MilvusDeployment(MilvusSettings(binary=str(tmp_path / "absent"))).start(tmp_path, timeout=5)


@pytest.mark.slow
def test_second_server_skips_a_taken_port(server, client, tmp_path: Path, monkeypatch) -> None:
    """A port taken between our pick and the bind is replaced; two servers run side by side."""
    real_free_ports = free_ports
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        picks: list[list[int]] = []

        def racy_free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
            ports = real_free_ports(n, host)
            picks.append([taken, *ports[1:]] if not picks else ports)
            return picks[-1]

        monkeypatch.setattr("apps.vdb.milvus.deploy.free_ports", racy_free_ports)
        second = MilvusDeployment(MilvusSettings())
        try:
            endpoints = second.start(tmp_path, timeout=180)
            assert len(picks) == 2 and endpoints.nodes[0].port not in (taken, server[1].nodes[0].port)
            other = MILVUS.client(MilvusSettings(), endpoints)
            other.create_collection(CollectionSpec(name="side", dim=4))
            other.insert(np.arange(3), np.ones((3, 4), dtype=np.float32))
            other.wait_searchable(3, timeout=60)
            other.close()
            client.create_collection(CollectionSpec(name="side", dim=4), recreate=True)
            assert client.count() == 0  # separate servers, separate data (etcd ports no longer collide)
        finally:
            second.stop()


def test_unusable_workdir(tmp_path: Path) -> None:
    workdir = tmp_path / "a_file"
    workdir.write_text("not a directory")
    with pytest.raises(DatabaseError, match="cannot set up"):
        MilvusDeployment(MilvusSettings()).start(workdir, timeout=5)


def test_port_already_taken(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(DatabaseError, match=f"port {port} on 127.0.0.1 is already in use"):
            MilvusDeployment(MilvusSettings(port=port)).start(tmp_path, timeout=5)


def test_rendered_config(tmp_path: Path) -> None:
    ports = write_config(tmp_path, {"proxy.ip": "127.0.0.1"}, proxy_port=None)
    config = yaml.safe_load((tmp_path / "configs" / "milvus.yaml").read_text())
    etcd = yaml.safe_load((tmp_path / "configs" / "etcd.yaml").read_text())
    assert len(set(ports.values())) == len(ports) == 12  # ten template ports, etcd peer, metrics
    assert config["proxy"]["port"] == ports["proxy_port"] and config["proxy"]["ip"] == "127.0.0.1"
    assert config["localStorage"]["path"] == str(tmp_path / "data")
    assert config["etcd"]["config"]["path"] == str(tmp_path / "configs" / "etcd.yaml")
    assert etcd["listen-client-urls"] == f"http://127.0.0.1:{ports['etcd_port']}"
    assert etcd["listen-peer-urls"] == f"http://127.0.0.1:{ports['etcd_peer_port']}"
    with pytest.raises(DatabaseError, match=r"'dataCoord\.nope' is not a key"):
        write_config(tmp_path, {"dataCoord.nope": 1}, proxy_port=None)


def test_settings_reject_unknown_keys() -> None:
    with pytest.raises(ValidationError, match="prot"):
        MilvusSettings.model_validate({"name": "milvus", "prot": 19530})
    with pytest.raises(ValidationError):
        MilvusSettings.model_validate({"name": "qdrant"})


def build(client: MilvusVectorClient, base: np.ndarray, **fields: object) -> dict:
    """Create a collection of ``base`` with the spec ``fields``, index it, return describe()'s details."""
    spec = CollectionSpec(dim=784, metric="l2", **fields)  # type: ignore[arg-type]
    client.create_collection(spec, recreate=True)
    load(client, base, batch=500)
    client.wait_searchable(len(base), timeout=60)
    client.build_index(timeout=180)
    return client.describe().details


@pytest.mark.slow
def test_ivf_sq8_scalar_quantisation_recall(client, fmnist) -> None:
    base, queries, truth = fmnist
    details = build(client, base, name="fm_sq8", index_type="ivf_flat", quantization="scalar", ivf_nlist=32)
    assert details["index_type"] == "IVF_SQ8" and details["indexed_rows"] == 1000
    assert recall_at_k(client.search(queries, k=10, ef=8).ids, truth, 10) >= 0.9  # int8 codes, 8 lists
    assert recall_at_k(client.search(queries, k=10, ef=1).ids, truth, 10) < 0.9  # one list: an IVF


@pytest.mark.slow
def test_ivf_pq_recall_follows_the_code_size(client, fmnist) -> None:
    base, queries, truth = fmnist
    fine = build(client, base, name="fm_pq196", index_type="ivf_pq", ivf_nlist=32, pq_m=196, pq_bits=8)
    assert fine["index_type"] == "IVF_PQ" and "'m': '196'" in str(fine["index_params"])
    assert "'nbits': '8'" in str(fine["index_params"]) and fine["indexed_rows"] == 1000
    fine_recall = recall_at_k(client.search(queries, k=10, ef=32).ids, truth, 10)  # every list probed
    assert 0.9 <= fine_recall < 1.0  # 4 dims per 8-bit code: close to exact, but quantised
    assert recall_at_k(client.search(queries, k=10, ef=1).ids, truth, 10) < 0.8  # one list of 32

    coarse = build(client, base, name="fm_pq16", index_type="ivf_pq", ivf_nlist=32, pq_m=16, pq_bits=8)
    assert "'m': '16'" in str(coarse["index_params"])
    coarse_recall = recall_at_k(client.search(queries, k=10, ef=32).ids, truth, 10)
    assert 0.6 <= coarse_recall < fine_recall - 0.05  # 49 dims per code loses more


@pytest.mark.slow
def test_unbuildable_indexes_are_refused_before_any_row_is_sent(client) -> None:
    with pytest.raises(DatabaseError, match=r"pq_m \(10\) to divide the dimension \(784\)"):
        client.create_collection(CollectionSpec(name="fm_bad", dim=784, index_type="ivf_pq", pq_m=10))
    with pytest.raises(DatabaseError, match=r"v2\.3\.5-lite: no DISKANN index: .*built without DiskANN"):
        client.create_collection(CollectionSpec(name="fm_bad", dim=784, index_type="diskann"))
    with pytest.raises(DatabaseError, match="on_disk with index_type 'hnsw'"):
        client.create_collection(CollectionSpec(name="fm_bad", dim=784, on_disk=True))
    assert not client.client.has_collection("fm_bad")


def _refused(uri: str, token: str) -> bool:
    """True when the server refuses a request sent with ``token``."""
    from pymilvus import MilvusClient

    try:
        MilvusClient(uri=uri, token=token, timeout=10).list_collections()
    except Exception as exc:  # MilvusException, or gRPC's own error for a wrong password
        return "auth" in str(exc).lower() or "illegal connection params" in str(exc)
    return False


@pytest.mark.slow
def test_server_requires_root_password_from_its_file(server, client) -> None:
    _, endpoints = server
    node = endpoints.nodes[0]
    password_file = Path(str(node.extra["password_file"]))
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    password = password_file.read_text().strip()
    assert len(password) == 48
    uri = f"http://{node.host}:{node.port}"
    assert _refused(uri, "") and _refused(uri, "root:Milvus") and _refused(uri, "root:wrong")
    client.create_collection(CollectionSpec(name="with_password", dim=4), recreate=True)  # as root
    assert client.count() == 0
    # Only the file holds it: not the endpoints, the rendered config, the logs or the command line.
    base = password_file.parent
    assert password not in endpoints.model_dump_json()
    config = yaml.safe_load((base / "configs" / "milvus.yaml").read_text())
    assert config["common"]["security"]["authorizationEnabled"] is True
    for path in [*base.glob("configs/*"), *map(Path, endpoints.log_paths)]:
        assert password not in path.read_text(errors="replace"), path
    for proc in psutil.process_iter(["cmdline"]):
        assert password not in " ".join(proc.info["cmdline"] or [])


@pytest.mark.slow
def test_native_rank_sets_root_password_before_it_is_ready(tmp_path: Path) -> None:
    """The HPC rank without Apptainer (python -m apps.vdb.milvus.native): root gets the password of the
    rank's file before the ready marker appears; the password is on no command line."""
    from apps.vdb.milvus.deploy import server_overrides
    from apps.vdb.milvus.native import PORTS

    ports = dict(zip([f"{name}_port" for name in PORTS], free_ports(len(PORTS)), strict=True))
    run, base, ready = tmp_path / "run", tmp_path / "rank", tmp_path / "rank" / "ready"
    run.mkdir()
    settings = MilvusSettings()
    argv = [sys.executable, "-m", "apps.vdb.milvus.native", "--base", str(base), "--ports", json.dumps(ports)]
    argv += ["--overrides", json.dumps(server_overrides(settings, "127.0.0.1"))]
    argv += ["--password-file", str(run / "root-password"), "--ready", str(ready)]
    log = tmp_path / "rank.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        password = (run / "root-password").read_text().strip()
        assert stat.S_IMODE((run / "root-password").stat().st_mode) == 0o600
        uri = f"http://127.0.0.1:{ports['proxy_port']}"
        assert _refused(uri, "root:Milvus")
        endpoints = Endpoints(
            database="milvus",
            nodes=[
                Endpoint(
                    host="127.0.0.1",
                    port=ports["proxy_port"],
                    extra={"password_file": str(run / "root-password")},
                )
            ],
            data_dir=str(base / "data"),
        )
        other = MILVUS.client(settings, endpoints)
        try:
            other.create_collection(CollectionSpec(name="native", dim=4), recreate=True)
        finally:
            other.close()
        assert password not in " ".join(psutil.Process(proc.pid).cmdline())
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_hpc_ranks_make_root_password_at_start_and_clients_find_it() -> None:
    from apps.vdb.cluster.config import DatabaseClusterConfig
    from apps.vdb.milvus.ranks import plan_ranks

    standalone = plan_ranks(MilvusSettings(), DatabaseClusterConfig(), "/images/milvus.sif", "/data", None)
    (rank,) = standalone.ranks
    assert rank.argv == [
        "/bin/sh",
        "/opt/pes2o/run/start-milvus.sh",
        "/opt/pes2o/run",
        "milvus",
        "run",
        "standalone",
    ]
    assert "export COMMON_SECURITY_DEFAULTROOTPASSWORD" in rank.files["start-milvus.sh"]
    assert rank.env["COMMON_SECURITY_AUTHORIZATIONENABLED"] == "true"
    assert "COMMON_SECURITY_DEFAULTROOTPASSWORD" not in rank.env
    assert yaml.safe_load(rank.files["user.yaml"])["common"]["security"]["authorizationEnabled"] is True
    assert rank.client_files == {"password_file": "run/root-password"}
