"""Milvus's local deployment: the real Milvus standalone server (PyPI package ``milvus``, 2.3.5).

* the ``milvus`` package's own launcher picks ports by scanning from fixed bases (19530, 9091, ...)
  and its embedded etcd always listens on 2379/2380, so two servers on one machine collide; we render
  the package's config template with free ports ourselves, give embedded etcd its own config file
  and run the binary in its own process group;
* Milvus 2.3's graceful stop waits up to 30 min for the query node: we bound it
  (``common.gracefulStopTimeout``: 5 s) and send SIGKILL after ``stop_grace``.

Listen addresses: embedded etcd's client and peer URLs are ours and on 127.0.0.1. Nothing else can be put
on loopback in 2.3.5: each component's gRPC server (proxy ``port`` and ``internalPort``, rootCoord,
queryCoord, queryNode, indexNode, dataCoord, dataNode) is opened with ``net.Listen("tcp", ":<port>")`` in
internal/distributed/<component>/service.go, and the metrics/healthz server (``METRICS_PORT``) likewise;
``<section>.ip`` is only the address written to etcd for the other components (checked with ``ss``: these
nine ports listen on ``::`` whatever ``ip`` says; 2.6's netutil.NewListener still ignores the IP). No key
or variable of 2.3.5 changes that, so the fix short of a network namespace or a patched build is to expose
less on them: the proxy's REST API (``proxy.http``, unauthenticated, served on the client port) is off,
as the benchmark client speaks gRPC only.

Authentication: authorization is on (``common.security.authorizationEnabled``, whatever
``config_overrides`` say), and once the server answers, the root password is changed from Milvus's default
(``Milvus``) to a random one kept in ``<workdir>/milvus/root-password`` (0600; clients connect as root with
it, the endpoint names the file: ``extra["password_file"]``). 2.3.5 has no setting for the initial root
password (``common.security.defaultRootPassword`` came with 2.4), so until that change, a second or so
after the proxy opens, the default password works. The Milvus image on HPC sets it at start instead
(:mod:`apps.vdb.milvus.ranks`).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from pymilvus import MilvusClient, MilvusException

from apps.vdb.base import DatabaseError, Deployment, Endpoint, Endpoints
from apps.vdb.milvus.env import AUTH_KEY, PASSWORD_FILE, ROOT, external_token, root_token, server_env
from apps.vdb.milvus.settings import MilvusSettings
from apps.vdb.process import ServerProcess, free_ports, http_ok, port_in_use
from apps.vdb.secret import new_secret, read_secret

DEFAULT_PASSWORD = "Milvus"  # root's password in a new Milvus (2.3.5 has no setting for it)
# Sections whose ``ip`` is the address a component advertises (default: the first non-loopback one); in
# 2.3.5 it does not choose the listen address (see the module doc).
IP_SECTIONS = ("rootCoord", "proxy", "queryCoord", "queryNode", "indexNode", "dataCoord", "dataNode")


def server_binary(settings: MilvusSettings) -> tuple[Path, Path]:
    """The Milvus executable and the directory of its bundled shared libraries."""
    if settings.binary:
        exe = Path(settings.binary)
        if not (exe.is_file() and os.access(exe, os.X_OK)):
            raise DatabaseError(f"milvus: binary {exe} does not exist or is not executable")
        return exe, exe.parent
    try:
        import milvus as milvus_pkg
    except ImportError as exc:
        raise DatabaseError(
            "milvus: no server binary; `pip install milvus==2.3.5` (bundles Milvus standalone) "
            "or set `binary` or `uri`"
        ) from exc
    root = settings.binary_cache_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pes2o-vdb"
    )
    cache = Path(root) / f"milvus-{milvus_pkg.__version__}"
    cache.mkdir(parents=True, exist_ok=True)
    # Unpacking takes ~7 s; the package skips files whose checksum matches, the lock serialises deployers.
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        milvus_pkg._initialize_data_files(str(cache))
    return cache / "bin" / "milvus", cache / "bin"


def write_config(
    base: Path, overrides: dict[str, Any], proxy_port: int | None, fixed: dict[str, int] | None = None
) -> dict[str, int]:
    """Render the package's milvus.yaml template under ``base`` with free ports (or the ``fixed`` ones an
    HPC rank was planned with, by template key); return the ports."""
    try:
        from milvus import MilvusServerConfig
    except ImportError as exc:
        raise DatabaseError("milvus: `pip install milvus==2.3.5` (its config template is used)") from exc
    cfg = MilvusServerConfig(data_dir=str(base))
    keys = [key for key in cfg.configurable_items if key.endswith("_port")]
    if fixed is not None:
        ports = dict(fixed)
    else:
        ports = dict(zip([*keys, "etcd_peer_port", "metrics_port"], free_ports(len(keys) + 2), strict=True))
    if proxy_port is not None:
        ports["proxy_port"] = proxy_port
    cfg.update(**{key: ports[key] for key in keys})
    for key, value in overrides.items():
        cfg.set(key, value)  # the template's dotted-key override mechanism (existing keys only)
    try:
        cfg.resolve()  # binds each port once to check it, then writes configs/milvus.yaml
    except RuntimeError as exc:
        raise DatabaseError(f"milvus: {exc}") from exc
    # Embedded etcd ignores etcd.endpoints and would listen on 2379/2380: give it its own config.
    configs = base / "configs"
    etcd_url, peer_url = (f"http://127.0.0.1:{ports[k]}" for k in ("etcd_port", "etcd_peer_port"))
    (configs / "etcd.yaml").write_text(
        f"name: default\nlisten-client-urls: {etcd_url}\nadvertise-client-urls: {etcd_url}\n"
        f"listen-peer-urls: {peer_url}\ninitial-advertise-peer-urls: {peer_url}\n"
        f"initial-cluster: default={peer_url}\n"
    )
    path = configs / "milvus.yaml"
    text = path.read_text().replace("etcd:\n", f"etcd:\n  config:\n    path: {configs / 'etcd.yaml'}\n", 1)
    path.write_text(text)
    loaded = yaml.safe_load(text)
    for key, value in overrides.items():
        node: Any = loaded
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node != value:
            raise DatabaseError(f"milvus: config_overrides key {key!r} is not a key of milvus.yaml 2.3")
    return ports


def server_overrides(settings: MilvusSettings, host: str) -> dict[str, Any]:
    """The milvus.yaml keys every 2.3 standalone server gets (the user's ``config_overrides`` win)."""
    return {
        "common.gracefulStopTimeout": 5,  # else the query node's graceful stop may wait 1800 s
        "proxy.http.enabled": False,  # the client port listens on every interface: no REST API there
        "indexCoord.segment.minSegmentNumRowsToEnableIndex": settings.min_segment_rows_to_index,
        "queryNode.enableDisk": True,  # load DISKANN indexes (2.3's default refuses them; 2.6 loads them)
        **{f"{section}.ip": host for section in IP_SECTIONS},
        **settings.config_overrides,
        AUTH_KEY: True,  # after the user's: every server this project starts requires the root password
    }


def secure_root(uri: str, password_file: Path, timeout: float) -> str:
    """Change root's password from Milvus's default to the one in ``password_file`` (made when missing),
    retried until the proxy answers; the token clients then use. A server whose root already has that
    password (a restart on the same directory) is left as it is."""
    if not password_file.is_file():
        new_secret(password_file)
    password = read_secret(password_file, "milvus: the root password file")
    token = root_token(password)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client = MilvusClient(uri=uri, token=root_token(DEFAULT_PASSWORD), timeout=min(10.0, timeout))
            try:
                client.update_password(ROOT, DEFAULT_PASSWORD, password)
            finally:
                client.close()
            return token
        except Exception as exc:  # MilvusException, or gRPC's own error for a refused password
            if _answers(uri, token):  # the default is refused because root has our password already
                return token
            if time.monotonic() > deadline:
                raise DatabaseError(f"milvus at {uri}: cannot set the root password: {exc}") from None
            time.sleep(0.5)


def _answers(uri: str, token: str) -> bool:
    """True when the server answers a request sent with ``token``."""
    try:
        client = MilvusClient(uri=uri, token=token, timeout=5.0)
        try:
            client.get_server_version()
        finally:
            client.close()
        return True
    except Exception:  # MilvusException, or gRPC's own error for a refused password
        return False


def _server_version(uri: str, token: str, timeout: float) -> str:
    """The server's version string (e.g. 'v2.3.5-lite'), retried until the proxy answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client = MilvusClient(uri=uri, token=token, timeout=min(10.0, timeout))
            try:
                return str(client.get_server_version())
            finally:
                client.close()
        except MilvusException as exc:
            if time.monotonic() > deadline:
                raise DatabaseError(f"milvus at {uri} did not answer within {timeout:.0f}s: {exc}") from exc
            time.sleep(0.5)


class MilvusDeployment(Deployment):
    """One Milvus standalone process with embedded etcd and local storage, or an existing server."""

    name = "milvus"
    wildcard_reason = "Milvus 2.3.5 has no setting for its component ports' address; see docs/reliability.md"

    def __init__(self, settings: MilvusSettings) -> None:
        self.settings = settings
        self.proc: ServerProcess | None = None

    def start(self, workdir: Path, timeout: float = 120.0) -> Endpoints:
        """Start Milvus with data, config and logs under ``workdir/milvus``; return when it answers."""
        s = self.settings
        if s.uri:
            url = urlparse(s.uri)
            version = _server_version(s.uri, external_token(s), timeout)
            node = Endpoint(host=url.hostname or "localhost", port=url.port or 19530)
            return Endpoints(
                database="milvus", nodes=[node], data_dir=s.data_dir or "", server_version=version
            )
        if s.port is not None and port_in_use(s.port):
            raise DatabaseError(
                f"milvus: port {s.port} on 127.0.0.1 is already in use; choose another or unset it"
            )
        exe, libdir = server_binary(s)
        base = Path(workdir).resolve() / "milvus"
        log = base / "logs" / "server.log"
        deadline = time.monotonic() + timeout
        overrides = server_overrides(s, s.host)
        paths = {
            "MILVUSCONF": str(base / "configs"),
            "MILVUS_RUN_DIR": str(base / "run"),
            "LD_LIBRARY_PATH": f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}",  # bundled libs
        }
        env = {**os.environ, **server_env(s, "STANDALONE", paths)}
        for attempt in range(s.start_attempts):
            argv = [str(exe), "run", "standalone"]
            self.proc = ServerProcess("milvus", argv, log, env=env, cwd=base, cpus=self.cpus)
            try:
                ports = write_config(base, overrides, s.port)
                self.proc.env["METRICS_PORT"] = str(ports["metrics_port"])  # also serves /healthz
                self.proc.start()
                health = f"http://127.0.0.1:{ports['metrics_port']}/healthz"
                self.proc.wait_healthy(lambda url=health: http_ok(url), max(1.0, deadline - time.monotonic()))
                uri = f"http://{s.host}:{ports['proxy_port']}"
                token = secure_root(uri, base / PASSWORD_FILE, max(1.0, deadline - time.monotonic()))
                version = _server_version(uri, token, max(1.0, deadline - time.monotonic()))
            except OSError as exc:  # an unusable workdir (a file, no permission, disk full)
                self.stop()
                raise DatabaseError(f"milvus: cannot set up {base}: {exc}") from exc
            except DatabaseError as exc:
                self.stop()
                # A port was taken after we picked it: try fresh ones (2.3's worker nodes would
                # silently pick another port themselves; coordinators, proxy and etcd cannot).
                taken = any(m in str(exc) for m in ("bind failed", "address already in use"))
                retry = taken and s.port is None
                if retry and attempt + 1 < s.start_attempts and time.monotonic() < deadline:
                    continue
                raise
            extra: dict[str, str | int] = {
                "metrics_port": ports["metrics_port"],
                "password_file": str(base / PASSWORD_FILE),  # root's; the password itself stays out
            }
            return Endpoints(
                database="milvus",
                nodes=[Endpoint(host=s.host, port=ports["proxy_port"], extra=extra)],
                data_dir=str(base / "data"),
                server_version=version,
                log_paths=[str(log), str(base / "logs" / "standalone-1.log")],
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def server_pids(self) -> dict[str, int]:
        """Name -> pid of the server process, when this deployment started one."""
        return {self.proc.name: self.proc.proc.pid} if self.proc is not None and self.proc.proc else {}

    def stop(self) -> None:
        """Stop the server process group (embedded etcd runs inside it); idempotent."""
        if self.proc is not None:
            self.proc.stop(grace=self.settings.stop_grace)
            self.proc = None
