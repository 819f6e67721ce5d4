"""Qdrant adapter on fmnist1k: the embedded engine (qdrant-edge-py) and qdrant-client (local mode)."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from apps.vdb import database
from apps.vdb.base import CollectionSpec, DatabaseError
from apps.vdb.qdrant.settings import QdrantSettings
from tests.conftest import recall_at

# Small segments must still get (and use) HNSW, otherwise every search would be an exact scan.
SMALL = {"indexing_threshold_kb": 1, "full_scan_threshold_kb": 1}


def spec(dim: int = 784, **kw: object) -> CollectionSpec:
    return CollectionSpec(name="fmnist", dim=dim, metric="l2", hnsw_m=16, ef_construction=128, **kw)


@pytest.fixture
def deploy(tmp_path: Path):
    """Start a deployment for the given settings; always stopped, even when the test fails."""
    started = []

    def _start(settings: QdrantSettings):
        adapter = database("qdrant")
        deployment = adapter.deployment(settings)
        started.append(deployment)
        endpoints = deployment.start(tmp_path / f"run{len(started)}", timeout=30)
        return deployment, endpoints, adapter.client(settings, endpoints)

    yield _start
    for deployment in started:
        deployment.stop()


def insert_all(client, base: np.ndarray, batch: int = 250) -> None:
    for lo in range(0, len(base), batch):
        client.insert(np.arange(lo, lo + batch, dtype=np.int64), base[lo : lo + batch])


def test_edge_deferred_hnsw_recall(deploy, fmnist) -> None:
    base, queries, truth = fmnist
    settings = QdrantSettings(**SMALL)
    _, endpoints, client = deploy(settings)
    assert endpoints.in_process and endpoints.server_version.startswith("qdrant-edge-py")
    client.create_collection(spec())
    insert_all(client, base)
    client.wait_searchable(len(base), timeout=10)
    assert client.count() == 1000
    before = client.describe()
    assert before.details["indexed_vectors_count"] == 0  # deferred: nothing indexed during upload

    # Without an index the search is exact: it must reproduce the published L2 ground truth and distances.
    exact = client.search(queries[:50], k=10, ef=None)
    assert recall_at(exact.ids, truth[:50], 10) == 1.0
    want = np.linalg.norm(base[truth[:50, :10]] - queries[:50, None, :], axis=2)
    np.testing.assert_allclose(exact.scores, want, rtol=1e-4)

    client.build_index(timeout=120)
    after = client.describe()
    assert after.count == 1000
    assert after.details["indexed_vectors_count"] == 1000  # HNSW built over every point
    assert after.segments >= 1 and after.disk_bytes > base.nbytes

    result = client.search(queries, k=10, ef=64)
    assert result.ids.shape == (500, 10) and result.ids.dtype == np.int64
    assert recall_at(result.ids, truth, 10) >= 0.9
    client.close()


def test_edge_retry_is_idempotent_and_survives_reopen(deploy, fmnist) -> None:
    base, _, _ = fmnist
    settings = QdrantSettings()
    deployment, endpoints, client = deploy(settings)
    client.create_collection(spec())
    insert_all(client, base[:500])
    client.insert(np.arange(250, 500, dtype=np.int64), base[250:500])  # a retried batch
    assert client.count() == 500
    client.close()
    deployment.stop()  # closes the shard: the WAL lock is released

    reopened = database("qdrant").client(settings, endpoints)
    reopened.create_collection(spec())  # attaches to the existing collection
    assert reopened.count() == 500
    reopened.close()


def test_edge_insert_stores_the_vectors_exactly(deploy, fmnist) -> None:
    base = fmnist[0][:100]
    _deployment, _endpoints, client = deploy(QdrantSettings())
    client.create_collection(spec())
    client.insert(np.arange(100, dtype=np.int64), base)  # rows passed as memoryviews of the array
    records = client.handle.shard.retrieve([0, 57, 99], False, True)
    assert sorted(r.id for r in records) == [0, 57, 99]
    for record in records:
        np.testing.assert_array_equal(np.asarray(record.vector, np.float32), base[record.id])
    client.close()


def test_edge_dimension_mismatch(deploy, fmnist) -> None:
    base, _, _ = fmnist
    _, _, client = deploy(QdrantSettings())
    client.create_collection(spec())
    client.insert(np.arange(10, dtype=np.int64), base[:10])
    with pytest.raises(DatabaseError, match=r"dimension 784.*dimension 128"):
        client.create_collection(spec(dim=128))
    client.create_collection(spec())
    short = client.search(base[:2], k=20, ef=None)  # only 10 points: the rest is padded with -1
    assert short.ids[0, 0] == 0 and (short.ids[:, 10:] == -1).all() and np.isnan(short.scores[:, 10:]).all()
    with pytest.raises(DatabaseError, match=r"queries have shape \(2, 5\), collection dimension is 784"):
        client.search(np.zeros((2, 5), dtype=np.float32), k=3, ef=None)
    with pytest.raises(ValueError, match="non-negative"):
        client.insert(np.array([-1]), base[:1])
    client.create_collection(spec(dim=128), recreate=True)
    assert client.count() == 0
    client.close()


def test_edge_shard_opened_by_a_second_process_fails_clearly(deploy) -> None:
    # Edge is in-process (Endpoints.in_process): a client in another process must get a clear error.
    _, endpoints, client = deploy(QdrantSettings())
    client.create_collection(spec(dim=4))
    code = (
        "import sys\n"
        "from apps.vdb import database\n"
        "from apps.vdb.base import CollectionSpec, Endpoints\n"
        "from apps.vdb.qdrant.settings import QdrantSettings\n"
        "c = database('qdrant').client(QdrantSettings(), Endpoints.model_validate_json(sys.argv[1]))\n"
        "c.create_collection(CollectionSpec(name='fmnist', dim=4, metric='l2'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, endpoints.model_dump_json()], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "DatabaseError: qdrant edge: cannot open" in done.stderr and "one process at a time" in done.stderr
    client.close()


@pytest.mark.slow
def test_server_client_against_local_mode(deploy, fmnist, tmp_path: Path) -> None:
    base, queries, truth = fmnist
    settings = QdrantSettings(
        mode="server", local_path=str(tmp_path / "local"), request_points=100, poll_s=0.05
    )
    _, endpoints, client = deploy(settings)
    assert "local mode" in endpoints.server_version
    client.create_collection(spec())
    assert client.max_request_size == 100  # request_points: the caller splits, the client never does
    with pytest.raises(DatabaseError, match=r"insert of 250 rows exceeds .* max_request_size of 100"):
        client.insert(np.arange(0, 250, dtype=np.int64), base[:250])
    insert_all(client, base, batch=100)
    client.insert(np.arange(0, 100, dtype=np.int64), base[:100])  # retried batch: no duplicates
    client.wait_searchable(len(base), timeout=10)
    assert client.count() == 1000
    client.build_index(timeout=30)  # update_collection + steady-state wait (local mode has no optimizer)
    result = client.search(queries, k=10, ef=64)
    assert recall_at(result.ids, truth, 10) >= 0.9
    stats = client.describe()
    assert stats.count == 1000 and stats.segments >= 1 and stats.disk_bytes > 0
    with pytest.raises(DatabaseError, match=r"dimension 784.*dimension 16"):
        client.create_collection(spec(dim=16))
    client.close()


def test_server_mode_without_url_or_binary(tmp_path: Path) -> None:
    settings = QdrantSettings(mode="server", binary="qdrant-not-installed-here")
    deployment = database("qdrant").deployment(settings)
    try:
        with pytest.raises(DatabaseError, match=r"qdrant-not-installed-here.*mode: edge"):
            deployment.start(tmp_path)
    finally:
        deployment.stop()


def test_server_binary_that_fails_shows_log_tail(tmp_path: Path) -> None:
    # A real process standing in for a broken qdrant install: it prints an error and exits.
    binary = tmp_path / "qdrant"
    binary.write_text(
        '#!/bin/sh\necho "panic: storage path $QDRANT__STORAGE__STORAGE_PATH not writable"\nexit 3\n'
    )
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    deployment = database("qdrant").deployment(QdrantSettings(mode="server", binary=str(binary)))
    try:
        with pytest.raises(DatabaseError, match=r"exited with code 3(.|\n)*panic: storage path .*storage"):
            deployment.start(tmp_path / "run", timeout=10)
    finally:
        deployment.stop()
    assert not deployment.proc.alive()


def test_url_mode_connects_without_starting(tmp_path: Path) -> None:
    deployment = database("qdrant").deployment(QdrantSettings(mode="server", url="http://127.0.0.1:1"))
    endpoints = deployment.start(tmp_path)
    assert endpoints.nodes[0].port == 1 and endpoints.nodes[0].grpc_port == 6334
    assert deployment.proc is None and not endpoints.in_process
    deployment.stop()


def test_server_client_sends_each_batch_as_one_request(deploy) -> None:
    # Issue 7: the client used to re-split batches into request_points-sized requests, so the configured
    # batch size was never what was sent. Now a batch is one upsert and a larger one is refused.
    _, _, client = deploy(QdrantSettings(mode="server", url=":memory:", request_points=4))
    client.create_collection(spec(dim=3))
    sent: list[int] = []
    upsert = client.qc.upsert
    client.qc.upsert = lambda name, points, **kw: (sent.append(len(points.ids)), upsert(name, points, **kw))
    client.insert(np.arange(4, dtype=np.int64), np.eye(4, 3, dtype=np.float32))
    assert sent == [4] and client.count() == 4
    with pytest.raises(DatabaseError, match=r"max_request_size of 4 \(qdrant setting request_points\)"):
        client.insert(np.arange(5, dtype=np.int64), np.ones((5, 3), dtype=np.float32))
    assert sent == [4] and client.count() == 4  # nothing of the refused batch was sent
    client.close()


def test_edge_client_has_no_request_limit(deploy) -> None:
    _, _, client = deploy(QdrantSettings())
    assert client.max_request_size is None
    client.create_collection(spec(dim=3))
    client.insert(np.arange(600, dtype=np.int64), np.ones((600, 3), dtype=np.float32))
    assert client.count() == 600
    client.close()


def test_settings_reject_unknown_keys() -> None:
    with pytest.raises(ValidationError):
        QdrantSettings(name="qdrant", indexing_threshold=5)


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory):
    """One edge deployment (small segments get HNSW) for the index-variant tests; always stopped."""
    settings = QdrantSettings(**SMALL)
    deployment = database("qdrant").deployment(settings)
    try:
        endpoints = deployment.start(tmp_path_factory.mktemp("qdrant-variants"), timeout=30)
        client = database("qdrant").client(settings, endpoints)
        yield client
        client.close()
    finally:
        deployment.stop()


# (spec fields, recall@10 at ef 64 at least, below (a quantised index is not exact), engine's quantization)
VARIANTS = {
    "on_disk": ({"on_disk": True}, 0.95, 1.01, "none"),
    "scalar": ({"quantization": "scalar"}, 0.95, 1.01, '"type": "int8"'),
    "scalar_on_disk": ({"quantization": "scalar", "on_disk": True}, 0.95, 1.01, '"always_ram": true'),
    # 196 codes of 4 dims: ratio x16; 16 codes of 49 dims: x64, coarser
    "pq_x16": ({"quantization": "pq", "pq_m": 196}, 0.93, 0.995, '"compression": "x16"'),
    "pq_x64": ({"quantization": "pq", "pq_m": 16}, 0.8, 0.95, '"compression": "x64"'),
    # fmnist's pixels are >= 0, so one bit per pixel keeps little: rescoring 4x oversampled candidates
    "bq": ({"quantization": "bq", "options": {"oversampling": 4.0}}, 0.6, 0.9, '"binary"'),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_edge_quantisation_and_on_disk_recall(edge, fmnist, variant: str) -> None:
    base, queries, truth = fmnist
    fields, low, high, engine = VARIANTS[variant]
    edge.create_collection(spec(**fields).model_copy(update={"name": f"fm_{variant}"}), recreate=True)
    insert_all(edge, base)
    edge.build_index(timeout=60)
    stats = edge.describe()
    assert stats.count == 1000 and stats.details["indexed_vectors_count"] == 1000
    assert engine in str(stats.details["engine_quantization"])  # what the shard persisted
    on_disk = bool(fields.get("on_disk"))
    assert (
        stats.details["engine_vectors_on_disk"] is on_disk and stats.details["engine_hnsw_on_disk"] is on_disk
    )
    shard = Path(edge.endpoints.data_dir) / f"fm_{variant}"
    quantised = list(shard.rglob("quantized.data"))
    assert bool(quantised) is ("quantization" in fields)  # the optimizer built the quantised vectors
    recall = recall_at(edge.search(queries, k=10, ef=64).ids, truth, 10)
    assert low <= recall < high, f"{variant}: recall {recall:.3f}"


def test_edge_bq_without_oversampling_shows_the_binary_codes(edge, fmnist) -> None:
    base, queries, truth = fmnist
    edge.create_collection(spec(quantization="bq").model_copy(update={"name": "fm_bq1"}), recreate=True)
    insert_all(edge, base)
    edge.build_index(timeout=60)
    assert recall_at(edge.search(queries, k=10, ef=64).ids, truth, 10) < 0.6  # candidates from 1-bit codes


def test_server_client_sends_quantisation_on_disk_and_rescoring(deploy) -> None:
    # No Qdrant server runs here and local mode ignores these settings: check the requests themselves
    # (qdrant-client's own pydantic models, which a server receives as they are).
    _, _, client = deploy(QdrantSettings(mode="server", url=":memory:"))
    created: list[dict] = []
    create = client.qc.create_collection
    client.qc.create_collection = lambda name, **kw: (created.append(kw), create(name, **kw))[1]
    client.create_collection(spec(dim=8, quantization="pq", pq_m=2, on_disk=True))
    sent = created[0]
    product = sent["quantization_config"].product
    assert product.compression.value == "x16" and product.always_ram is True  # 4 * 8 / 2
    assert sent["vectors_config"].on_disk is True and sent["hnsw_config"].on_disk is True
    client.insert(np.arange(20, dtype=np.int64), np.random.default_rng(0).random((20, 8), dtype=np.float32))
    queries: list = []
    batch = client.qc.query_batch_points
    client.qc.query_batch_points = lambda name, requests: (queries.append(requests), batch(name, requests))[1]
    client.search(np.ones((2, 8), dtype=np.float32), k=3, ef=32)
    params = queries[0][0].params
    assert params.hnsw_ef == 32 and params.quantization.rescore is True
    details = client.describe().details
    assert details["quantization"] == "pq" and details["pq_ratio"] == 16 and details["on_disk"] is True
    client.close()


def test_unbuildable_quantisation_is_refused(edge) -> None:
    with pytest.raises(DatabaseError, match="quantization 'scalar' needs index_type hnsw"):
        edge.create_collection(spec(index_type="flat", quantization="scalar"))
    with pytest.raises(DatabaseError, match="8-bit codes, not pq_bits 4"):
        edge.create_collection(spec(quantization="pq", pq_bits=4))


# A stand-in for the qdrant server (no Qdrant server binary is installed here: edge runs in process): it
# listens where QDRANT__SERVICE__* say and, as Qdrant does with QDRANT__SERVICE__API_KEY set, answers /,
# /readyz and friends to anyone and every other path only with the key in the ``api-key`` header.
FAKE_QDRANT = """#!{python}
import json, os
from http.server import BaseHTTPRequestHandler, HTTPServer

KEY = os.environ.get("QDRANT__SERVICE__API_KEY")
OPEN = ("/", "/healthz", "/readyz", "/livez")

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path not in OPEN and (not KEY or self.headers.get("api-key") != KEY):
            return self._send(403, "Invalid api-key" if KEY else "no key configured")
        if self.path == "/":
            return self._send(200, {{"title": "fake qdrant", "version": "1.16.0"}})
        return self._send(200, {{"result": {{"exists": False}}, "status": "ok", "time": 0.0}})

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

print("fake qdrant: api key", "set" if KEY else "missing", flush=True)
host, port = os.environ["QDRANT__SERVICE__HOST"], int(os.environ["QDRANT__SERVICE__HTTP_PORT"])
HTTPServer((host, port), Handler).serve_forever()
"""


def test_started_server_requires_the_api_key_from_its_file(tmp_path: Path) -> None:
    import psutil
    from qdrant_client import QdrantClient

    binary = tmp_path / "qdrant"
    binary.write_text(FAKE_QDRANT.format(python=sys.executable))
    binary.chmod(0o755)
    settings = QdrantSettings(mode="server", binary=str(binary), prefer_grpc=False, timeout_s=10)
    adapter = database("qdrant")
    deployment = adapter.deployment(settings)
    try:
        endpoints = deployment.start(tmp_path / "run", timeout=30)
        assert endpoints.server_version == "qdrant 1.16.0"  # GET / asked with the key
        node = endpoints.nodes[0]
        key_file = Path(str(node.extra["api_key_file"]))
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        assert len(key) == 48
        server = psutil.Process(deployment.proc.proc.pid)
        assert server.environ()["QDRANT__SERVICE__API_KEY"] == key  # the environment...
        assert key not in " ".join(server.cmdline())  # ...never the command line
        assert key not in endpoints.model_dump_json()  # endpoints only name the file
        assert "api key set" in Path(endpoints.log_paths[0]).read_text()
        assert all(key not in Path(p).read_text() for p in endpoints.log_paths)
        client = adapter.client(settings, endpoints)
        try:
            assert client.qc.collection_exists("anything") is False  # sent with the key: answered
        finally:
            client.close()
        anonymous = QdrantClient(url=str(node.extra["url"]), prefer_grpc=False, timeout=10, trust_env=False)
        with pytest.raises(Exception, match="403"):
            anonymous.collection_exists("anything")
        anonymous.close()
    finally:
        deployment.stop()


def test_peers_start_through_a_script_that_exports_the_key_from_their_run_directory() -> None:
    from apps.vdb.cluster.config import DatabaseClusterConfig
    from apps.vdb.qdrant.ranks import plan_ranks

    cluster = DatabaseClusterConfig(workers=2)
    plan = plan_ranks(QdrantSettings(mode="server"), cluster, "/images/qdrant.sif", "/data", None)
    for rank in plan.ranks:
        assert rank.argv[:4] == [
            "/bin/sh",
            "/opt/pes2o/run/start-qdrant.sh",
            "/opt/pes2o/run",
            "/qdrant/qdrant",
        ]
        assert ("${VDB_RANK_DIR}", "/opt/pes2o/run") in rank.binds
        assert "QDRANT__SERVICE__API_KEY" not in rank.env  # env files are plain files: only the script has it
        assert "export QDRANT__SERVICE__API_KEY" in rank.files["start-qdrant.sh"]
        assert rank.client_files == {"api_key_file": "run/api-key"}
