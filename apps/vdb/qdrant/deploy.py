"""Qdrant's local deployment: nothing to start for edge, else a server URL or the ``qdrant`` binary.

* ``mode: edge``: the embedded engine runs in the client's process; the deployment only owns the data dir.
* ``mode: server``: ``url`` (an existing server), ``url: ":memory:"`` / ``local_path`` (qdrant-client's
  local mode, see :mod:`apps.vdb.qdrant.server`), or a ``qdrant`` binary started on free loopback ports.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
from pathlib import Path
from urllib.parse import urlparse

from apps.vdb.base import DatabaseError, Deployment, Endpoint, Endpoints
from apps.vdb.noproxy import urlopen
from apps.vdb.process import ServerProcess, free_ports, http_ok
from apps.vdb.qdrant.env import server_env
from apps.vdb.qdrant.handles import EDGE, LOCAL
from apps.vdb.qdrant.settings import QdrantSettings


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
            return Endpoints(database="qdrant", nodes=[node], data_dir="", server_version=_version(s.url))
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
        for attempt in range(2):  # a port taken between picking and binding: pick again once
            http, grpc = free_ports(2)
            snapshots = str(workdir / "qdrant" / "snapshots")
            env = {**os.environ, **server_env("127.0.0.1", http, grpc, str(self.data_dir), snapshots)}
            if self.settings.edge_search_threads:  # set for a core count (apps.vdb.binding)
                threads = str(self.settings.edge_search_threads)
                env["QDRANT__STORAGE__PERFORMANCE__MAX_SEARCH_THREADS"] = threads
            cwd = self.data_dir.parent
            self.proc = ServerProcess("qdrant", [binary], log, env=env, cwd=cwd, cpus=self.cpus)
            self.data_dir.mkdir(parents=True, exist_ok=True)
            try:
                self.proc.start()
                self.proc.wait_healthy(lambda p=http: http_ok(f"http://127.0.0.1:{p}/readyz"), timeout)
            except DatabaseError as exc:
                self.proc.stop()
                if attempt == 0 and "address already in use" in str(exc).lower():
                    continue
                raise
            url = f"http://127.0.0.1:{http}"
            node = Endpoint(host="127.0.0.1", port=http, grpc_port=grpc, extra={"url": url})
            return Endpoints(
                database="qdrant",
                nodes=[node],
                data_dir=str(self.data_dir),
                server_version=_version(url),
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


def _version(url: str) -> str:
    """The server's version from ``GET /`` (provenance)."""
    try:
        with urlopen(url.rstrip("/") + "/", timeout=5) as resp:
            return "qdrant " + str(json.load(resp).get("version", "?"))
    except (OSError, ValueError):
        return "qdrant (version unknown)"
