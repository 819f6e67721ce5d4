"""The Weaviate adapter against the real weaviate-server v1.36 (one node and a 2-node loopback cluster).

The server binary comes from `make weaviate` (scripts/weaviate/build.sh); without it these tests fail with
the message that says how to build it.
"""

from __future__ import annotations

import base64
import stat
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest

from apps.interchange.vecs import read_vecs
from apps.vdb import database
from apps.vdb.base import CollectionSpec, DatabaseError
from apps.vdb.weaviate.client import WeaviateClient, class_name
from apps.vdb.weaviate.deploy import WeaviateDeployment
from apps.vdb.weaviate.rest import node_key, rest_json
from apps.vdb.weaviate.settings import WeaviateSettings
from tests.conftest import SHARED

DATA = SHARED / "ann" / "fmnist1k"
K = 10


@pytest.fixture(scope="module")
def fmnist() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fmnist1k: 1000 base vectors, 500 queries, exact L2 top-100 (0-based row ids)."""
    return (
        read_vecs(DATA / "fmnist1k_base.fvecs"),
        read_vecs(DATA / "fmnist1k_query.fvecs"),
        read_vecs(DATA / "fmnist1k_groundtruth.ivecs"),
    )


def recall(ids: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(row) & set(t[:K])) / K for row, t in zip(ids, truth, strict=True)]))


def start(tmp_path: Path, **settings):
    """Start a deployment and a client; the caller stops the deployment."""
    cfg = WeaviateSettings(**settings)
    deployment = WeaviateDeployment(cfg)
    return cfg, deployment, deployment.start(tmp_path, timeout=90)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One weaviate-server node for the module's single-node tests."""
    cfg, deployment, endpoints = None, None, None
    try:
        cfg, deployment, endpoints = start(tmp_path_factory.mktemp("weaviate1"))
        yield cfg, endpoints
    finally:
        if deployment is not None:
            deployment.stop()


@pytest.fixture
def client(single):
    cfg, endpoints = single
    c = WeaviateClient(cfg, endpoints)
    try:
        yield c
    finally:
        c.close()


def load(client: WeaviateClient, base: np.ndarray, spec: CollectionSpec, batch: int = 250) -> None:
    client.create_collection(spec, recreate=True)
    for lo in range(0, len(base), batch):
        client.insert(np.arange(lo, min(lo + batch, len(base))), base[lo : lo + batch])
    client.wait_searchable(len(base), timeout=60)
    client.build_index(timeout=60)


def test_registry_and_settings():
    adapter = database("weaviate")
    assert adapter.settings is WeaviateSettings
    with pytest.raises(ValueError, match="nodez"):
        WeaviateSettings(nodez=2)
    assert class_name("pes2o-ve") == "Pes2o_ve"


def test_missing_binary_says_how_to_build(tmp_path, monkeypatch):
    with pytest.raises(DatabaseError, match="does not exist") as err:
        WeaviateDeployment(WeaviateSettings(binary=str(tmp_path / "nope"))).start(tmp_path)
    assert "make weaviate" in str(err.value)
    assert "scripts/weaviate/build.sh v1.36.0" in str(err.value)
    # Nothing anywhere and no Go: the message says Go is needed.
    monkeypatch.delenv("WEAVIATE_BIN", raising=False)
    monkeypatch.setattr("apps.vdb.weaviate.deploy.REPO_ROOT", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DatabaseError, match="Go is not installed") as err:
        WeaviateDeployment(WeaviateSettings()).start(tmp_path)
    assert "make weaviate" in str(err.value)


def _servers_under(path: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if "weaviate" in (proc.info["name"] or "") and str(path) in proc.environ().get(
                "PERSISTENCE_DATA_PATH", ""
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.mark.slow
def test_failed_start_reports_log_tail_and_leaves_nothing_running(tmp_path):
    deployment = WeaviateDeployment(
        WeaviateSettings(nodes=2, env={"PERSISTENCE_MEMTABLES_MAX_SIZE_MB": "lots"})
    )
    with pytest.raises(DatabaseError) as err:
        deployment.start(tmp_path, timeout=60)
    message = str(err.value)
    assert "exited with code" in message and "node0.log" in message
    assert "PERSISTENCE_MEMTABLES_MAX_SIZE_MB" in message  # the server's own complaint, from the log tail
    deployment.stop()  # safe after a failed start
    assert _servers_under(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("index_type", ["hnsw", "dynamic", "flat"])
def test_single_node_recall_and_l2_distances(client, fmnist, index_type):
    base, queries, truth = fmnist
    spec = CollectionSpec(
        name=f"fm_{index_type}",
        dim=784,
        metric="l2",
        index_type=index_type,
        options={"dynamic_threshold": 300},
    )
    load(client, base, spec)
    result = client.search(queries, k=K, ef=64)
    assert result.ids.shape == (500, K) and (result.ids >= 0).all()
    assert recall(result.ids, truth) >= 0.9
    # Weaviate's l2-squared distances are the squared exact L2 distances, ascending like the ground truth.
    exact = ((base[result.ids] - queries[:, None, :]) ** 2).sum(-1)
    np.testing.assert_allclose(result.scores, exact, rtol=1e-4)
    assert (np.diff(result.scores, axis=1) >= 0).all()
    stats = client.describe()
    assert stats.count == 1000 and stats.segments == 1
    assert (
        stats.disk_bytes and stats.disk_bytes > 1000 * 784 * 4
    )  # objects + index hold at least the raw vectors


@pytest.mark.slow
def test_ef_is_applied_on_the_server(client, single, fmnist):
    base, queries, _ = fmnist
    load(client, base[:300], CollectionSpec(name="fm_ef", dim=784, metric="cosine"))
    client.search(queries[:5], k=K, ef=123)
    endpoints = single[1]
    url = f"http://127.0.0.1:{endpoints.nodes[0].port}/v1/schema/Fm_ef"
    schema = rest_json(url, node_key(endpoints.nodes[0]))
    assert schema["vectorConfig"]["default"]["vectorIndexConfig"]["ef"] == 123


@pytest.mark.slow
def test_retried_batch_does_not_duplicate(client, fmnist):
    base = fmnist[0][:200]
    client.create_collection(CollectionSpec(name="fm_retry", dim=784, metric="l2"), recreate=True)
    client.insert(np.arange(200), base)
    client.insert(np.arange(100, 200), base[100:])  # the retry of a batch that had already landed
    client.wait_searchable(200, timeout=30)
    assert client.count() == 200
    result = client.search(base[150:151], k=1, ef=None)
    assert result.ids[0, 0] == 150


@pytest.mark.slow
def test_inserted_vectors_are_exact_and_searchable_once_wait_searchable_returns(client, fmnist):
    base = fmnist[0][:300]
    client.create_collection(CollectionSpec(name="fm_bytes", dim=784, metric="l2"), recreate=True)
    client.insert(np.arange(256), base[:256])  # the request built from the vectors' bytes
    client._pb2 = None  # a client library without those messages: insert_many
    client.insert(np.arange(256, 300), base[256:])
    client.wait_searchable(300, timeout=60)
    # Right away every row finds itself (a shard still INDEXING reports an empty queue, yet misses rows).
    found = client.search(base, k=1, ef=None).ids[:, 0]
    assert (found == np.arange(300)).mean() >= 0.95
    for obj in client._collection.query.fetch_objects(limit=300, include_vector=True).objects:
        np.testing.assert_array_equal(np.asarray(obj.vector["default"], np.float32), base[obj.uuid.int])


@pytest.mark.slow
def test_batch_is_one_request_up_to_insert_request_size(single, fmnist):
    # Issue 7: insert used to re-split batches into insert_request_size requests; now the caller splits.
    cfg, endpoints = single
    client = WeaviateClient(cfg.model_copy(update={"insert_request_size": 100}), endpoints)
    try:
        assert client.max_request_size == 100
        client.create_collection(CollectionSpec(name="fm_limit", dim=784, metric="l2"), recreate=True)
        with pytest.raises(DatabaseError, match=r"insert of 101 rows exceeds .* max_request_size of 100"):
            client.insert(np.arange(101), fmnist[0][:101])
        client.insert(np.arange(100), fmnist[0][:100])
        client.wait_searchable(100, timeout=30)
        assert client.count() == 100
    finally:
        client.close()


@pytest.mark.slow
def test_dimension_mismatch_is_a_clear_error(client, single, fmnist):
    base = fmnist[0][:50]
    client.create_collection(CollectionSpec(name="fm_dims", dim=784, metric="l2"), recreate=True)
    client.insert(np.arange(50), base)
    client.wait_searchable(50, timeout=30)
    other = WeaviateClient(*single)
    try:
        with pytest.raises(DatabaseError, match=r"dimension 784.*dimension 128"):
            other.create_collection(CollectionSpec(name="fm_dims", dim=128, metric="l2"))
    finally:
        other.close()
    with pytest.raises(DatabaseError, match=r"\(3, 128\).*784"):
        client.search(np.zeros((3, 128), np.float32), k=K, ef=None)
    # Vectors the server itself rejects (its index has 784 dims) raise too. (Sent before the async queue
    # indexed anything, v1.36 reports 1 failure but stores all of them: hence the client-side check.)
    client._spec = client._spec.model_copy(update={"dim": 16})
    with pytest.raises(DatabaseError, match=r"batch of 5 objects failed.*length 16.*length 784"):
        client.insert(np.arange(5), np.ones((5, 16), np.float32))


def _on_shard(endpoint, shard: str, row: int, auth: tuple[str, str]) -> bool:
    """Whether ``row`` is stored in ``shard`` of that node (Weaviate's internal cluster API, basic auth)."""
    url = f"http://127.0.0.1:{endpoint.extra['data_port']}/indices/Fm_cluster/shards/{shard}/objects/"
    request = urllib.request.Request(f"{url}{uuid.UUID(int=int(row))}?check_exists=1")
    request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request) as resp:
            return resp.status == 204
    except urllib.error.HTTPError as exc:
        assert exc.code == 404, exc
        return False


@pytest.mark.slow
def test_two_node_cluster_shards_and_answers_from_both(tmp_path, fmnist):
    base, queries, truth = fmnist
    deployment = None
    try:
        # Memtables flushed after 1 s so the nodes API's (flushed-only) object counts become visible.
        cfg, deployment, endpoints = start(
            tmp_path, nodes=2, env={"PERSISTENCE_MEMTABLES_FLUSH_DIRTY_AFTER_SECONDS": "1"}
        )
        assert len(endpoints.nodes) == 2 and len(endpoints.log_paths) == 2
        client = WeaviateClient(cfg, endpoints)
        try:
            load(client, base, CollectionSpec(name="fm_cluster", dim=784, metric="l2", shards=2))
            shards = {s.node: s for s in client._shards()}
            assert sorted(shards) == ["node0", "node1"]  # one shard on each node
            client._wait(
                lambda: (
                    all(s.object_count > 0 for s in client._shards())
                    and sum(s.object_count for s in client._shards()) == 1000,
                    [s.object_count for s in client._shards()],
                ),
                30,
                "objects on both nodes in the nodes API",
            )
            result = client.search(queries, k=K, ef=64)
            assert recall(result.ids, truth) >= 0.9
            stats = client.describe()
            assert stats.count == 1000 and stats.segments == 2
        finally:
            client.close()
        returned = np.unique(result.ids)
        auth = deployment.cluster_auth
        placed = {
            node.extra["name"]: {
                r for r in returned if _on_shard(node, shards[node.extra["name"]].name, r, auth)
            }
            for node in endpoints.nodes
        }
        assert placed["node0"] and placed["node1"], placed  # neighbours come from both shards
        assert placed["node0"] | placed["node1"] == set(returned) and not placed["node0"] & placed["node1"]
    finally:
        if deployment is not None:
            deployment.stop()
    assert _servers_under(tmp_path) == []


@pytest.fixture(scope="module")
def centred(fmnist):
    """fmnist1k moved so the base has mean 0: L2 neighbours (the ground truth) are unchanged, and the sign
    bits BQ keeps carry information (fmnist's pixels are all >= 0)."""
    base, queries, truth = fmnist
    mean = base.mean(axis=0)
    return base - mean, queries - mean, truth


# (spec fields, recall@10 at ef 64 at least, the server's compression): recall thresholds fail on a
# broken index (a random answer scores ~0.01) but allow for what the quantiser loses.
COMPRESSED = {
    "hnsw_sq": ({"quantization": "scalar", "options": {"training_limit": 500}}, 0.9, "sq"),
    "hnsw_pq": ({"quantization": "pq", "pq_m": 196, "options": {"training_limit": 500}}, 0.9, "pq"),
    "hnsw_bq": ({"quantization": "bq"}, 0.8, "bq"),
    "flat_bq": ({"index_type": "flat", "quantization": "bq"}, 0.5, "bq"),
    "flat_bq_on_disk": ({"index_type": "flat", "quantization": "bq", "on_disk": True}, 0.5, "bq"),
    "dynamic_bq": (
        {"index_type": "dynamic", "quantization": "bq", "options": {"dynamic_threshold": 300}},
        0.7,
        "bq",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(COMPRESSED))
def test_compressed_indexes_recall_and_server_config(client, centred, variant):
    base, queries, truth = centred
    fields, low, compression = COMPRESSED[variant]
    spec = CollectionSpec(name=f"fm_{variant}", dim=784, metric="l2", **fields)
    load(client, base, spec)  # build_index waits until the shard is compressed (SQ/PQ train first)
    details = client.describe().details
    kind = fields.get("index_type", "hnsw")
    assert details["server_index_type"] == kind
    parts = (
        ("server_hnsw_compression", "server_flat_compression")
        if kind == "dynamic"
        else ["server_compression"]
    )
    assert all(details[part] == compression for part in parts)
    assert [v for k, v in details.items() if k.endswith(".compressed")] == [True]
    if kind == "flat":  # on_disk: BQ codes read from disk, not cached
        assert details["server_bq_cache"] is not fields.get("on_disk", False)
    assert recall(client.search(queries, k=K, ef=64).ids, truth) >= low


@pytest.mark.slow
def test_a_collection_of_exactly_the_training_limit_is_built_and_stays_uncompressed(client, fmnist):
    """Weaviate compresses a shard holding more than its training limit: at exactly the limit the index
    stage must not wait for a compression that never comes (it hung until index_timeout_s)."""
    base, queries, truth = fmnist
    spec = CollectionSpec(
        name="fm_sq_at_limit",
        dim=784,
        metric="l2",
        quantization="scalar",
        options={"training_limit": len(base)},
    )
    started = time.monotonic()
    load(client, base, spec)  # build_index(timeout=60) raised "index steady state not reached" before
    assert time.monotonic() - started < 50
    details = client.describe().details
    assert [v for k, v in details.items() if k.endswith(".compressed")] == [False]
    assert recall(client.search(queries, k=K, ef=64).ids, truth) >= 0.9


@pytest.mark.slow
def test_pq_stays_uncompressed_below_its_training_limit(client, fmnist):
    base, queries, truth = fmnist
    spec = CollectionSpec(name="fm_pq_untrained", dim=784, metric="l2", quantization="pq", pq_m=196)
    load(client, base, spec)  # Weaviate's default training limit is 100000 objects
    details = client.describe().details
    assert details["server_compression"] == "pq"
    assert [v for k, v in details.items() if k.endswith(".compressed")] == [False]
    assert recall(client.search(queries, k=K, ef=64).ids, truth) >= 0.9


@pytest.mark.slow
def test_uncompressable_combinations_are_refused_before_creation(client):
    for fields, message in (
        ({"index_type": "flat", "quantization": "pq"}, "flat index compresses with none, bq, not 'pq'"),
        ({"quantization": "pq", "pq_m": 10}, r"pq_m \(10\) to divide the dimension \(784\)"),
        ({"on_disk": True}, "on_disk needs index_type flat"),
    ):
        with pytest.raises(DatabaseError, match=message):
            client.create_collection(CollectionSpec(name="fm_refused", dim=784, **fields))
    assert not client._client.collections.exists("Fm_refused")


def test_server_refuses_requests_without_the_api_key(single, client):
    import weaviate

    _, endpoints = single
    node = endpoints.nodes[0]
    key_file = Path(str(node.extra["api_key_file"]))
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().strip()
    assert len(key) == 48 and key == node_key(node)
    # Refused: REST without a key or with another one, and weaviate-client without credentials.
    meta = f"http://127.0.0.1:{node.port}/v1/meta"
    for wrong in (None, "not-the-key"):
        with pytest.raises(urllib.error.HTTPError) as err:
            rest_json(meta, wrong)
        assert err.value.code == 401
    with pytest.raises(Exception, match=r"401|nauthori"):
        weaviate.connect_to_custom(
            http_host=node.host,
            http_port=node.port,
            http_secure=False,
            grpc_host=node.host,
            grpc_port=node.grpc_port,
            grpc_secure=False,
        )
    # Accepted with the key: REST, and the adapter's client over gRPC (it reads the key from the file).
    assert rest_json(meta, key)["version"] == endpoints.server_version
    client.create_collection(CollectionSpec(name="fm_key", dim=4, metric="l2"), recreate=True)
    client.insert(np.arange(3), np.eye(3, 4, dtype=np.float32))
    client.wait_searchable(3, timeout=30)
    assert client.count() == 3
    # The key is in the servers' environment only: not in their command line, logs or the endpoints.
    assert key not in endpoints.model_dump_json()
    servers = _servers_under(Path(endpoints.data_dir))
    assert servers and all(key not in " ".join(p.cmdline()) for p in servers)
    assert all(p.environ()["AUTHENTICATION_APIKEY_ALLOWED_KEYS"] == key for p in servers)
    assert all(key not in Path(log).read_text(errors="replace") for log in endpoints.log_paths)
