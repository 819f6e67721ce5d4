"""Qdrant's local deployment: nothing to start for edge, else a server URL or the ``qdrant`` binary.

* ``mode: edge``: the embedded engine runs in the client's process; the deployment only owns the data dir.
* ``mode: server``: ``url`` (an existing server), ``url: ":memory:"`` / ``local_path`` (qdrant-client's
  local mode, see :mod:`apps.vdb.qdrant.server`), or a ``qdrant`` binary started on free loopback ports.

A started binary requires a random API key (``QDRANT__SERVICE__API_KEY`` in its environment), kept in a
0600 file beside its storage whose path the endpoint carries (``extra["api_key_file"]``) for the clients.
Neither edge nor local mode listens on a network, so neither has a key; an existing server's key comes
from the environment variable named by ``api_key_env``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from apps.vdb.base import DatabaseError, Deployment, Endpoint, Endpoints
from apps.vdb.noproxy import urlopen
from apps.vdb.process import ServerProcess, free_ports, http_ok
from apps.vdb.qdrant.env import API_KEY_FILE, API_KEY_VAR, server_env
from apps.vdb.qdrant.handles import EDGE, LOCAL
from apps.vdb.qdrant.settings import QdrantSettings
from apps.vdb.secret import new_secret, read_secret

KEY_FILE_ERROR = "qdrant: the API key file"


class QdrantDeployment(Deployment):
    """Edge: nothing to start. Server: connect to ``url`` or start the ``qdrant`` binary."""

    name = "qdrant"

    def __init__(self, settings: QdrantSettings) -> None:
        self.settings = settings
        self.proc: ServerProcess | None = None
        self.data_dir: Path | None = None
        self.local_key: str | None = None  # qdrant-client local-mode location opened by clients

    def start(self, workdir: Path, timeout: float = 120.0) -> Endpoints:
        """Return endpoints; in server mode with a binary, start it and wait for ``/readyz``."""
        s, workdir = self.settings, Path(workdir)
        if s.mode == "edge":
            self.data_dir = workdir / "qdrant-edge"
            self.data_dir.mkdir(parents=True, exist_ok=True)
            version = f"qdrant-edge-py {importlib.metadata.version('qdrant-edge-py')}"
            return Endpoints(
                database="qdrant",
                nodes=[],
                data_dir=str(self.data_dir),
                in_process=True,
                server_version=version,
            )
        if s.url == ":memory:" or s.local_path:
            self.local_key = s.local_path or ":memory:"
            node = Endpoint(host="local", port=0, extra={"location": self.local_key})
            version = f"qdrant-client {importlib.metadata.version('qdrant-client')} local mode"
            return Endpoints(
                database="qdrant",
                nodes=[node],
                data_dir=s.local_path or "",
                in_process=True,
                server_version=version,
            )
        if s.url:
            url = urlparse(s.url)
            node = Endpoint(
                host=url.hostname or "localhost",
                port=url.port or 6333,
                grpc_port=s.grpc_port,
                extra={"url": s.url},
            )
            key = os.environ.get(s.api_key_env) if s.api_key_env else None
            version = _version(s.url, key)
            return Endpoints(database="qdrant", nodes=[node], data_dir="", server_version=version)
        binary = shutil.which(s.binary)
        if binary is None:
            raise DatabaseError(
                f"qdrant server mode: no url is set and the binary {s.binary!r} was not found. Install the "
                "Qdrant server (release binary or `cargo build --release` of qdrant; on HPC the "
                "qdrant/qdrant container), set `binary:` to its path or `url:` to a running server, "
                "or use `mode: edge` (embedded engine, pip package qdrant-edge-py)."
            )
        return self._start_binary(binary, workdir, timeout)

    def _start_binary(self, binary: str, workdir: Path, timeout: float) -> Endpoints:
        self.data_dir = workdir / "qdrant" / "storage"
        log = workdir / "logs" / "qdrant.log"
        key_file = new_secret(workdir / "qdrant" / API_KEY_FILE)
        key = read_secret(key_file, KEY_FILE_ERROR)
        for attempt in range(2):  # a port taken between picking and binding: pick again once
            http, grpc = free_ports(2)
            snapshots = str(workdir / "qdrant" / "snapshots")
            env = {**os.environ, **server_env("127.0.0.1", http, grpc, str(self.data_dir), snapshots)}
            env[API_KEY_VAR] = key  # the environment, never the command line (ps shows that to anyone)
            if self.settings.edge_search_threads:  # set for a core count (apps.vdb.binding)
                threads = str(self.settings.edge_search_threads)
                env["QDRANT__STORAGE__PERFORMANCE__MAX_SEARCH_THREADS"] = threads
            cwd = self.data_dir.parent
            self.proc = ServerProcess("qdrant", [binary], log, env=env, cwd=cwd, cpus=self.cpus)
            self.data_dir.mkdir(parents=True, exist_ok=True)
            try:
                self.proc.start()
                ready = _request(
                    f"http://127.0.0.1:{http}/readyz", key
                )  # the key is harmless where not asked
                self.proc.wait_healthy(lambda r=ready: http_ok(r), timeout)
            except DatabaseError as exc:
                self.proc.stop()
                if attempt == 0 and "address already in use" in str(exc).lower():
                    continue
                raise
            url = f"http://127.0.0.1:{http}"
            extra: dict[str, str | int] = {"url": url, "api_key_file": str(key_file)}
            node = Endpoint(host="127.0.0.1", port=http, grpc_port=grpc, extra=extra)
            return Endpoints(
                database="qdrant",
                nodes=[node],
                data_dir=str(self.data_dir),
                server_version=_version(url, key),
                log_paths=[str(log)],
            )
        raise AssertionError("unreachable")

    def server_pids(self) -> dict[str, int]:
        """Name -> pid of the server process, when this deployment started one."""
        return {self.proc.name: self.proc.proc.pid} if self.proc is not None and self.proc.proc else {}

    def stop(self) -> None:
        """Stop the started server, or close the in-process shards/local clients of this deployment."""
        if self.proc is not None:
            self.proc.stop()
        if self.local_key is not None:
            LOCAL.release(self.local_key, force=True)
        if self.settings.mode == "edge" and self.data_dir is not None:
            for key in list(EDGE.items):
                if Path(key).parent == self.data_dir:
                    EDGE.release(key, force=True)


def _request(url: str, key: str | None) -> urllib.request.Request:
    """GET ``url`` with the API key header when there is a key."""
    return urllib.request.Request(url, headers={"api-key": key} if key else {})


def _version(url: str, key: str | None = None) -> str:
    """The server's version from ``GET /`` (provenance), asked with the API key when there is one."""
    try:
        with urlopen(_request(url.rstrip("/") + "/", key), timeout=5) as resp:
            return "qdrant " + str(json.load(resp).get("version", "?"))
    except (OSError, ValueError):
        return "qdrant (version unknown)"
