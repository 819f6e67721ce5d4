"""Clients reach their database directly even when the environment names an HTTP proxy (as ALCF nodes do).

The proxy variables point at a port nothing listens on: a request sent through the proxy fails at once.
Weaviate and Milvus are real local servers (started before the variables are set, as on HPC where the
servers never see them); Qdrant's server client talks REST to a small stand-in server (its edge engine is
in-process and has no connection at all).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from apps.vdb import database
from apps.vdb.base import Endpoint, Endpoints
from apps.vdb.milvus.settings import MilvusSettings
from apps.vdb.noproxy import bypass_proxy
from apps.vdb.process import free_port, http_ok
from apps.vdb.qdrant.settings import QdrantSettings
from apps.vdb.weaviate.settings import WeaviateSettings
from tests.conftest import REPO

PROXY_VARS = ("http_proxy", "https_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy")


@pytest.fixture
def dead_proxy(monkeypatch: pytest.MonkeyPatch) -> str:
    """Every proxy variable names 127.0.0.1:<a port nothing listens on>; no_proxy is unset."""
    proxy = f"http://127.0.0.1:{free_port()}"
    for var in PROXY_VARS:
        monkeypatch.setenv(var, proxy)
    for var in ("no_proxy", "NO_PROXY", "no_grpc_proxy"):
        monkeypatch.delenv(var, raising=False)
    return proxy


def test_bypass_proxy_merges_both_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("no_proxy", "localhost,.alcf.anl.gov")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    far = "x1000c0s1b0n0.hsn.cm.aurora.alcf.anl.gov"
    bypass_proxy(["x1000c0s0b0n0", f"http://{far}:19530", None, "localhost"])
    expected = f"localhost,.alcf.anl.gov,127.0.0.1,x1000c0s0b0n0,{far}"
    assert os.environ["no_proxy"] == os.environ["NO_PROXY"] == expected


# A client in a fresh process, as in the stage's pool: no channel opened before the variables were set
# (pymilvus reuses a connection to the same address, gRPC a subchannel), so the bypass is what is tested.
ROUNDTRIP = """
import sys
import numpy as np
from apps.vdb import database
from apps.vdb.base import CollectionSpec, Endpoints

adapter = database(sys.argv[1])
settings = adapter.settings.model_validate_json(sys.argv[2])
client = adapter.client(settings, Endpoints.model_validate_json(sys.argv[3]))
client.create_collection(CollectionSpec(name="proxy_check", dim=8, metric="l2"), recreate=True)
vectors = np.random.default_rng(0).random((20, 8), dtype=np.float32)
client.insert(np.arange(20), vectors)
client.wait_searchable(20, timeout=60)
assert client.count() == 20
assert client.search(vectors[:2], k=1, ef=16).ids[:, 0].tolist() == [0, 1]
if sys.argv[1] == "weaviate":
    client._set_ef(32)  # REST calls to every node (schema, shards)
client.close()
print("roundtrip ok")
"""


def roundtrip_in_fresh_process(name: str, settings, endpoints: Endpoints) -> None:
    """Create, insert, count and search through a client started in a new process (the current env)."""
    argv = [sys.executable, "-c", ROUNDTRIP, name, settings.model_dump_json(), endpoints.model_dump_json()]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "roundtrip ok" in done.stdout, done.stderr[-3000:]


@pytest.fixture(scope="module")
def weaviate_server(tmp_path_factory) -> Iterator[tuple[WeaviateSettings, Endpoints]]:
    settings = WeaviateSettings()
    deployment = database("weaviate").deployment(settings)
    try:
        yield settings, deployment.start(tmp_path_factory.mktemp("weaviate-proxy"), timeout=90)
    finally:
        deployment.stop()


@pytest.fixture(scope="module")
def milvus_server(tmp_path_factory) -> Iterator[tuple[MilvusSettings, Endpoints]]:
    settings = MilvusSettings()
    deployment = database("milvus").deployment(settings)
    try:
        yield settings, deployment.start(tmp_path_factory.mktemp("milvus-proxy"), timeout=180)
    finally:
        deployment.stop()


@pytest.mark.slow
def test_weaviate_client_ignores_the_proxy(weaviate_server, dead_proxy) -> None:
    settings, endpoints = weaviate_server
    node = endpoints.nodes[0]
    assert http_ok(f"http://{node.host}:{node.port}/v1/.well-known/ready")  # health checks too
    roundtrip_in_fresh_process("weaviate", settings, endpoints)


@pytest.mark.slow
def test_milvus_client_ignores_the_proxy(milvus_server, dead_proxy) -> None:
    roundtrip_in_fresh_process("milvus", *milvus_server)


class _QdrantStandIn(BaseHTTPRequestHandler):
    """Answers the two REST calls the test makes, as Qdrant would."""

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "":
            body = {"title": "qdrant - vector search engine", "version": "1.16.2", "commit": None}
        else:
            body = {"result": {"exists": self.path.endswith("/exists")}, "status": "ok", "time": 0.0}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def test_qdrant_server_client_ignores_the_proxy(dead_proxy, tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _QdrantStandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        node = Endpoint(host="127.0.0.1", port=port, extra={"url": f"http://127.0.0.1:{port}"})
        endpoints = Endpoints(database="qdrant", nodes=[node], data_dir="")
        client = database("qdrant").client(QdrantSettings(mode="server", prefer_grpc=False), endpoints)
        try:
            assert client.qc.collection_exists("proxy_check") is True
        finally:
            client.qc.close()
    finally:
        server.shutdown()
        server.server_close()
