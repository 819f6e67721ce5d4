"""Weaviate's local deployment: the real ``weaviate-server`` (v1.36), one node or an N-node loopback cluster.

* N nodes on one host need ``CLUSTER_IN_LOCALHOST=true`` (see :mod:`apps.vdb.weaviate.env`).
* A joining node exits at once when node 0's gossip port is not listening yet, so node 0 starts first.
* Every listener is on 127.0.0.1: REST through ``--host``, gossip and raft through ``CLUSTER_BIND_ADDR``,
  the public gRPC port and the internal cluster API through ``GRPC_BIND_HOST`` and
  ``CLUSTER_DATA_BIND_HOST``. Upstream v1.36.0 has no setting for those two (it opens them with
  ``net.Listen("tcp", ":<port>")``, adapters/handlers/grpc/server.go ``StartAndListen`` and
  adapters/handlers/rest/clusterapi/serve.go ``NewServer``, i.e. on every interface): ``make weaviate``
  builds the server with scripts/weaviate/listen-host.patch, which adds them. A server built without the
  patch ignores them and listens on every interface; the cluster API is closed to strangers all the same
  (and to other local users) with a per-deployment basic-auth secret (``CLUSTER_BASIC_AUTH_*``).
* REST and gRPC require an API key (anonymous access off, :mod:`apps.vdb.weaviate.env`): one random key for
  every node of the deployment, in ``<workdir>/api-key`` (0600), given to the servers in their environment
  and read by the clients from the file the endpoints name (``extra["api_key_file"]``). Readiness
  (``/v1/.well-known/ready``) is open; ``/v1/meta`` and ``/v1/nodes`` are asked with the key. The nodes'
  own traffic does not use it: gossip and raft have no authentication in Weaviate, and the cluster API
  has its basic-auth secret above.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from pathlib import Path
from urllib.parse import urlparse

from apps.vdb.base import DatabaseError, Deployment, Endpoint, Endpoints
from apps.vdb.process import ServerProcess, free_port_block, get_json, http_ok, port_in_use
from apps.vdb.secret import new_secret, read_secret
from apps.vdb.weaviate.env import API_KEY_FILE, API_KEY_VAR, server_env
from apps.vdb.weaviate.rest import KEY_FILE_ERROR, rest_json
from apps.vdb.weaviate.settings import WeaviateSettings

REPO_ROOT = Path(__file__).resolve().parents[3]
WEAVIATE_VERSION = "v1.36.0"
BUILD_HINT = (
    f"build it with `make weaviate` (or `{REPO_ROOT}/scripts/weaviate/build.sh {WEAVIATE_VERSION}`: needs "
    "Go >= 1.25 and about 4 minutes), or set WEAVIATE_BIN / the `binary` setting to an existing "
    "weaviate-server"
)


def find_binary(settings: WeaviateSettings) -> str:
    """The weaviate-server to run, or DatabaseError saying how to build it."""
    explicit = settings.binary or os.environ.get("WEAVIATE_BIN")
    if explicit:  # a path the user chose must exist: never fall back silently
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise DatabaseError(
            f"weaviate-server {explicit!r} (setting `binary` / $WEAVIATE_BIN) does not exist; {BUILD_HINT}"
        )
    local = REPO_ROOT / ".build/bin/weaviate-server"
    found = str(local) if local.is_file() else shutil.which("weaviate-server")
    if found:
        return found
    go = shutil.which("go")
    go_note = f"Go is at {go}" if go else "Go is not installed: install Go first (https://go.dev/dl)"
    raise DatabaseError(f"weaviate-server not found in {local} nor on PATH; {BUILD_HINT}. {go_note}.")


def _node_ports(n: int) -> list[dict[str, int]]:
    """Distinct free ports for n nodes; raft needs raft + 1 free too (internal RPC in localhost mode)."""
    base = free_port_block(6 * n)
    roles = ("http", "grpc", "gossip", "data", "raft")  # the sixth port of each node is raft + 1
    return [{role: base + 6 * i + j for j, role in enumerate(roles)} for i in range(n)]


class WeaviateDeployment(Deployment):
    """Starts N ``weaviate-server`` processes on loopback (or attaches to ``settings.url``)."""

    name = "weaviate"

    def __init__(self, settings: WeaviateSettings) -> None:
        self.settings = settings
        self.procs: list[ServerProcess] = []
        self.cluster_auth: tuple[str, str] | None = None  # (user, password) of the internal cluster API
        self.api_key: str | None = None  # the key clients send (also in <workdir>/api-key)

    def start(self, workdir: Path, timeout: float = 120.0) -> Endpoints:
        """Start the nodes, wait until every one is ready and (N > 1) sees the whole cluster."""
        timeout = self.settings.startup_timeout or timeout
        if self.settings.url:
            return self._attach(timeout)
        binary = find_binary(self.settings)
        workdir = Path(workdir).resolve()
        n = self.settings.nodes
        ports = _node_ports(n)
        join = ",".join(f"node{i}:{p['raft']}" for i, p in enumerate(ports))
        deadline = time.monotonic() + timeout
        # The cluster API is closed to anyone without the secret (see the module doc): one secret shared by
        # the nodes, kept in memory only (Endpoints may be written to the workdir).
        self.cluster_auth = ("pes2o-vdb", secrets.token_urlsafe(24))
        cluster_auth = {
            "CLUSTER_BASIC_AUTH_USERNAME": self.cluster_auth[0],
            "CLUSTER_BASIC_AUTH_PASSWORD": self.cluster_auth[1],
        }
        key_file = new_secret(workdir / API_KEY_FILE)
        self.api_key = key = read_secret(key_file, KEY_FILE_ERROR)

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        try:
            for i, p in enumerate(ports):
                own = {**p, "raft_rpc": p["raft"] + 1}  # localhost mode: internal RPC at raft + 1
                env = {
                    **os.environ,
                    **self.settings.env,
                    **server_env(
                        self.settings,
                        node=f"node{i}",
                        data_path=str(workdir / f"node{i}"),
                        advertise="127.0.0.1",
                        ports=own,
                        raft_join=join,
                        expect=n,
                        bind="127.0.0.1",
                    ),
                    **cluster_auth,
                    API_KEY_VAR: key,  # the environment, never the command line (ps shows that to anyone)
                }
                if i > 0:
                    env["CLUSTER_JOIN"] = f"127.0.0.1:{ports[0]['gossip']}"
                if self.settings.gomaxprocs:
                    env["GOMAXPROCS"] = str(self.settings.gomaxprocs)
                argv = [binary, "--host", "127.0.0.1", "--port", str(p["http"]), "--scheme", "http"]
                log = workdir / "logs" / f"node{i}.log"
                proc = ServerProcess(f"weaviate node{i}", argv, log, env=env, cpus=self.cpus)
                proc.start()
                self.procs.append(proc)
                if i == 0 and n > 1:  # joiners exit if node 0's gossip port is not up yet
                    proc.wait_healthy(lambda g=p["gossip"]: port_in_use(g), left(), 0.1)
            for proc, p in zip(self.procs, ports, strict=True):
                base = f"http://127.0.0.1:{p['http']}/v1"
                proc.wait_healthy(lambda b=base: http_ok(f"{b}/.well-known/ready"), left())
            if n > 1:
                self.procs[0].wait_healthy(lambda: self._cluster_formed(ports[0]["http"], n, key), left())
            meta = rest_json(f"http://127.0.0.1:{ports[0]['http']}/v1/meta", key)
        except BaseException:
            self.stop()
            raise
        nodes = [
            Endpoint(
                rank=i,
                host="127.0.0.1",
                port=p["http"],
                grpc_port=p["grpc"],
                extra={
                    "name": f"node{i}",
                    "data_dir": str(workdir / f"node{i}"),
                    "data_port": p["data"],
                    "api_key_file": str(key_file),
                },
            )
            for i, p in enumerate(ports)
        ]
        return Endpoints(
            database="weaviate",
            nodes=nodes,
            data_dir=str(workdir),
            server_version=str(meta.get("version", "")),
            log_paths=[str(proc.log_path) for proc in self.procs],
        )

    @staticmethod
    def _cluster_formed(http_port: int, n: int, key: str) -> bool:
        try:
            nodes = rest_json(f"http://127.0.0.1:{http_port}/v1/nodes", key)["nodes"]
        except (OSError, ValueError, KeyError):
            return False
        return len(nodes) == n and all(node.get("status") == "HEALTHY" for node in nodes)

    def _attach(self, timeout: float) -> Endpoints:
        url = urlparse(self.settings.url or "")
        host, port = url.hostname, url.port  # NodeUrl requires both
        deadline = time.monotonic() + timeout
        while not http_ok(f"http://{host}:{port}/v1/.well-known/ready"):
            if time.monotonic() > deadline:
                raise DatabaseError(f"Weaviate at {self.settings.url} is not ready after {timeout:.0f}s")
            time.sleep(0.5)
        meta = get_json(f"http://{host}:{port}/v1/meta")
        node = Endpoint(host=host, port=port, grpc_port=self.settings.grpc_port)
        return Endpoints(database="weaviate", nodes=[node], data_dir="", server_version=str(meta["version"]))

    def server_pids(self) -> dict[str, int]:
        """Name -> pid of each node's server process."""
        return {p.name: p.proc.pid for p in self.procs if p.proc is not None}

    def stop(self) -> None:
        """Stop every node started (also after a failed start); later nodes first."""
        for proc in reversed(self.procs):
            proc.stop()
        self.procs = []
