"""Which addresses the database servers listen on: loopback locally, the configured interface on HPC.

The slow tests start each local database as a run does and list the listening TCP sockets of the server
processes (and their children) with psutil. Every listener must be on 127.0.0.1, except the ones the
server versions we run open on every interface with no setting to change it (``EVERY_INTERFACE``, see
apps/vdb/milvus/deploy.py); those must be closed to strangers as far as the server allows. Weaviate has no
such exception: the project builds it with scripts/weaviate/listen-host.patch, which adds the settings
upstream lacks. The fast tests read the rendered HPC rank scripts (no wildcard address in any of them) and
check that the Weaviate build script rebuilds exactly when the patch changed.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from subprocess import PIPE

import psutil
import pytest
import yaml

from apps.vdb.base import Deployment
from apps.vdb.cluster.layout import node_shape, plan_cluster
from apps.vdb.cluster.render import render_files
from apps.vdb.process import http_ok
from apps.vdb.server_facts import WILDCARDS, listeners
from pipeline.config.loader import load_config
from tests.conftest import REPO
from tests.pipeline.test_hpc_render import artifacts, fixed_env, two_local_ranks  # noqa: F401  (fixed_env: a fixture used below)

LOOPBACK = {"127.0.0.1", "::1"}
# Listeners that the server opens with net.Listen(":<port>") whatever its configuration (Milvus 2.3.5):
# the only ones allowed on a wildcard address. Weaviate's two such listeners (gRPC, cluster data) follow
# GRPC_BIND_HOST and CLUSTER_DATA_BIND_HOST in our patched build, so it has none.
EVERY_INTERFACE: dict[str, set[str]] = {
    "milvus": {
        "proxy",
        "proxy_internal",
        "rootCoord",
        "queryCoord",
        "queryNode",
        "indexNode",
        "dataCoord",
        "dataNode",
        "metrics",
    },
}


# Said when Weaviate's gRPC or data port is on a wildcard address: most likely an unpatched server.
HINT = " (is weaviate-server the patched build? `make weaviate` rebuilds it: scripts/weaviate/)"


def weaviate_roles(pid: int) -> dict[int, str]:
    """Port -> role of one weaviate-server, read from its own command line and environment."""
    proc = psutil.Process(pid)
    argv, env = proc.cmdline(), proc.environ()
    names = {
        "GRPC_PORT": "grpc",
        "CLUSTER_DATA_BIND_PORT": "data",
        "CLUSTER_GOSSIP_BIND_PORT": "gossip",
        "RAFT_PORT": "raft",
        "RAFT_INTERNAL_RPC_PORT": "raft_rpc",
    }
    roles = {int(env[key]): role for key, role in names.items()}
    roles[int(argv[argv.index("--port") + 1])] = "http"
    return roles


def milvus_roles(pid: int) -> dict[int, str]:
    """Port -> role of the Milvus standalone server, read from its milvus.yaml, etcd.yaml and environment."""
    env = psutil.Process(pid).environ()
    configs = Path(env["MILVUSCONF"])
    cfg = yaml.safe_load((configs / "milvus.yaml").read_text())
    roles = {int(cfg[s]["port"]): s for s in EVERY_INTERFACE["milvus"] if s in cfg and "port" in cfg[s]}
    roles[int(cfg["proxy"]["internalPort"])] = "proxy_internal"
    roles[int(env["METRICS_PORT"])] = "metrics"
    etcd = yaml.safe_load((configs / "etcd.yaml").read_text())
    roles[int(etcd["listen-client-urls"].rsplit(":", 1)[1])] = "etcd_client"
    roles[int(etcd["listen-peer-urls"].rsplit(":", 1)[1])] = "etcd_peer"
    return roles


def check_addresses(database: str, socks: list[tuple[int, str, int]], roles: dict[int, str]) -> None:
    """Every listener is known; only the documented ones are on a wildcard address, the rest on loopback."""
    assert socks, "no listening socket found: is psutil allowed to read the server's sockets?"
    unknown = [(addr, port) for _, addr, port in socks if port not in roles]
    assert not unknown, f"{database}: listeners nobody configured: {unknown}"
    wild = sorted({roles[port] for _, addr, port in socks if addr in WILDCARDS})
    assert set(wild) <= EVERY_INTERFACE.get(database, set()), f"{database}: on every interface: {wild}{HINT}"
    other = [(roles[port], addr) for _, addr, port in socks if addr not in WILDCARDS and addr not in LOOPBACK]
    assert not other, f"{database}: listeners on a non-loopback address: {other}"


@pytest.fixture
def started() -> Iterator[list[Deployment]]:
    """Deployments a test starts; stopped afterwards even when the test fails, and checked gone."""
    deployments: list[Deployment] = []
    pids: list[int] = []
    yield deployments
    for deployment in deployments:
        procs = getattr(deployment, "procs", None) or [getattr(deployment, "proc", None)]
        pids += [p.proc.pid for p in procs if p is not None and p.proc is not None]
        deployment.stop()
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert not alive, f"server processes survived stop(): {alive}"


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [1, 2])
def test_weaviate_listens_on_loopback_only(nodes: int, tmp_path: Path, started: list[Deployment]) -> None:
    from apps.vdb.weaviate.deploy import WeaviateDeployment, find_binary
    from apps.vdb.weaviate.rest import node_key, rest_json
    from apps.vdb.weaviate.settings import WeaviateSettings

    settings = WeaviateSettings(nodes=nodes)
    try:
        find_binary(settings)
    except Exception as exc:
        pytest.skip(str(exc))
    deployment = WeaviateDeployment(settings)
    started.append(deployment)
    endpoints = deployment.start(tmp_path, timeout=180)
    pids = [p.proc.pid for p in deployment.procs if p.proc is not None]
    roles = {port: role for pid in pids for port, role in weaviate_roles(pid).items()}
    socks = listeners(pids)
    check_addresses("weaviate", socks, roles)
    assert {roles[port] for _, _, port in socks} >= {"http", "grpc", "data", "gossip", "raft"}
    # Defence in depth (other local users reach loopback too): REST refuses requests without the
    # deployment's API key, the cluster API those without the nodes' secret.
    key = node_key(endpoints.nodes[0])
    for node in endpoints.nodes:
        meta = f"http://127.0.0.1:{node.port}/v1/meta"
        with pytest.raises(urllib.error.HTTPError) as refused:
            rest_json(meta, None)
        assert refused.value.code == 401
        assert rest_json(meta, key)["version"]
        request = urllib.request.Request(f"http://127.0.0.1:{node.extra['data_port']}/nodes/status")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 401
        wrong = base64.b64encode(b"pes2o-vdb:guess").decode()
        request.add_header("Authorization", f"Basic {wrong}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 401
        assert deployment.cluster_auth is not None  # the nodes' own secret is accepted
        right = base64.b64encode(":".join(deployment.cluster_auth).encode()).decode()
        request.add_header("Authorization", f"Basic {right}")
        with urllib.request.urlopen(request, timeout=5) as resp:
            assert resp.status == 200


@pytest.mark.slow
def test_milvus_listens_on_loopback_only(tmp_path: Path, started: list[Deployment]) -> None:
    pytest.importorskip("milvus")
    from apps.vdb.milvus.deploy import DEFAULT_PASSWORD, MilvusDeployment, _answers
    from apps.vdb.milvus.env import node_token, root_token
    from apps.vdb.milvus.settings import MilvusSettings

    deployment = MilvusDeployment(MilvusSettings())
    started.append(deployment)
    endpoints = deployment.start(tmp_path, timeout=180)
    assert deployment.proc is not None and deployment.proc.proc is not None
    pid = deployment.proc.proc.pid
    roles = milvus_roles(pid)
    check_addresses("milvus", listeners([pid]), roles)
    assert {"etcd_client", "etcd_peer"} <= set(roles.values())
    # The client port listens on every interface in 2.3.5: its unauthenticated REST API must be off,
    # and gRPC requires root's password from the deployment's 0600 file (no longer Milvus's default).
    port = endpoints.nodes[0].port
    assert not http_ok(f"http://127.0.0.1:{port}/v1/vector/collections", timeout=5)
    uri = f"http://127.0.0.1:{port}"
    password_file = Path(str(endpoints.nodes[0].extra["password_file"]))
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    assert _answers(uri, node_token(endpoints.nodes[0]))
    assert not _answers(uri, root_token(DEFAULT_PASSWORD)) and not _answers(uri, "")


FAKE_APPTAINER = r'''#!{python}
"""Stands in for `apptainer exec`: applies --bind to the env file's values and to the command's arguments
(the rank's start script and run directory), and runs the real server where the image's would run."""
import os, sys
args, binds, env_file, i = sys.argv[2:], [], None, 0
while args[i].startswith("-"):
    if args[i] == "--bind":
        binds.append(args[i + 1].split(":"))
    if args[i] == "--env-file":
        env_file = args[i + 1]
    i += 2 if args[i] in ("--bind", "--env-file", "--pwd") else 1
command = args[i + 1:]


def host(value):
    """A path inside the container as the host path bound there; anything else as it is."""
    for source, target in binds:
        if value == target or value.startswith(target + "/"):
            return source + value[len(target):]
    return value


env = dict(line.strip().split("=", 1) for line in open(env_file) if "=" in line)
env = {{key: host(value.strip('"')) for key, value in env.items()}}
# /bin/sh runs the start script (it makes the API key and execs the server); the server is the real binary
command = [{binary!r} if arg == {server!r} else host(arg) for arg in command]
os.execve(command[0], command, {{**env, "PATH": os.environ["PATH"]}})
'''


def non_loopback_interface() -> tuple[str, str] | None:
    """(name, IPv4 address) of an interface other than loopback, if this machine has one."""
    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.family.name == "AF_INET" and not addr.address.startswith("127."):
                return name, addr.address
    return None


@pytest.mark.slow
def test_weaviate_hpc_ranks_listen_on_the_interface(tmp_path: Path) -> None:
    """Two Weaviate ranks as the pilot starts them (a stand-in for apptainer runs the real binary)."""
    from apps.vdb.cluster.pilot import ClusterDeployment
    from apps.vdb.weaviate.deploy import find_binary
    from apps.vdb.weaviate.env import API_KEY_FILE
    from apps.vdb.weaviate.rest import node_key, rest_json
    from apps.vdb.weaviate.settings import WeaviateSettings
    from pipeline.config.model import LocalExecutorConfig

    interface = non_loopback_interface()
    if interface is None:
        pytest.skip("no network interface besides loopback")
    try:
        binary = find_binary(WeaviateSettings())
    except Exception as exc:
        pytest.skip(str(exc))
    name, address = interface
    fake = tmp_path / "apptainer"
    fake.write_text(FAKE_APPTAINER.format(python=sys.executable, binary=binary, server="/bin/weaviate"))
    fake.chmod(0o755)
    (tmp_path / "weaviate.sif").write_bytes(b"SIF")
    images = {"weaviate": str(tmp_path / "weaviate.sif")}
    cluster = two_local_ranks(tmp_path, fake, images, startup_timeout_s=120, interface=name)
    base = cluster.base_port
    deployment = ClusterDeployment(WeaviateSettings(), cluster, LocalExecutorConfig(), poll_s=0.5)
    pids: list[int] = []
    try:
        endpoints = deployment.start(tmp_path / "server", timeout=150)
        assert {node.host for node in endpoints.nodes} == {address}
        # REST requires the rank's API key, which its start script made in a 0600 file of its run directory
        first = endpoints.nodes[0]
        url = f"http://{address}:{first.port}/v1/nodes"
        with pytest.raises(urllib.error.HTTPError) as refused:
            rest_json(url, None)
        assert refused.value.code == 401
        nodes = rest_json(url, node_key(first))["nodes"]
        assert [node["status"] for node in nodes] == ["HEALTHY", "HEALTHY"]
        keys = [Path(str(node.extra["api_key_file"])) for node in endpoints.nodes]
        assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in keys)
        pids = [p.pid for p in psutil.process_iter() if p.name() == "weaviate-server" and _rank_of(p, base)]
        assert len(pids) == 2
        # ... and is on no command line, in no rendered script, env file or log
        secrets = {path.read_text().strip() for path in keys}
        assert not [pid for pid in pids if secrets & set(psutil.Process(pid).cmdline())]
        files = [f for f in (tmp_path / "server").rglob("*") if f.is_file() and f.name != API_KEY_FILE]
        assert files and not [f for f in files if any(k in f.read_text(errors="replace") for k in secrets)]
        roles = {port: role for pid in pids for port, role in weaviate_roles(pid).items()}
        socks = listeners(pids)
        wild = sorted({roles[port] for _, addr, port in socks if addr in WILDCARDS})
        assert not wild, f"weaviate ranks on every interface: {wild}{HINT}"
        assert {addr for _, addr, port in socks} == {address}
        assert {roles[port] for _, addr, port in socks} >= {"http", "grpc", "data", "gossip", "raft"}
    finally:
        deployment.stop(grace=30)
    gone = psutil.wait_procs([psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)], timeout=10)[1]
    assert not gone, f"server processes survived stop(): {gone}"


def _rank_of(proc: psutil.Process, base: int) -> bool:
    """True when ``proc`` is one of this test's ranks (its REST port is in the test's port range)."""
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return False
    return "--port" in argv and base <= int(argv[argv.index("--port") + 1]) < base + 20


@pytest.mark.usefixtures("fixed_env")
@pytest.mark.parametrize("platform", ["polaris", "aurora"])
def test_hpc_rank_scripts_name_no_wildcard_address(platform: str, tmp_path: Path) -> None:
    """Every rendered rank script, env file and config file binds to the interface or loopback."""
    loaded = load_config(REPO / "configs" / f"{platform}.yaml")
    cfg = loaded.config
    texts = dict(artifacts(platform))
    for settings in cfg.vdb.databases:
        cluster = cfg.vdb.cluster.for_database(settings.name)
        layout = plan_cluster(
            settings, cluster, node_shape(cfg.executor), tmp_path / settings.name, loaded.base_dir
        )
        texts.update(
            {f"{settings.name}/{name}": text for name, text in render_files(layout, cluster).items()}
        )
        for spec in layout.ranks:  # readiness is probed where the server listens
            assert spec.ready_url.startswith(("http://127.0.0.1:", "http://${VDB_ADDR}:")), spec.ready_url
    assert any(name.endswith("server.env") for name in texts)
    for name, text in texts.items():
        for wildcard in ("0.0.0.0", "[::]", "://:"):
            assert wildcard not in text, f"{platform}: {name} names the wildcard address {wildcard!r}"


def test_weaviate_env_binds_every_listener_it_can_name() -> None:
    """The one bind address reaches gossip/raft and the two listeners only the patched build can place."""
    from apps.vdb.weaviate.env import server_env
    from apps.vdb.weaviate.settings import WeaviateSettings

    ports = dict.fromkeys(("gossip", "data", "raft", "raft_rpc", "grpc"), 1)
    where = {"node": "n", "data_path": "/d", "advertise": "A", "raft_join": "", "expect": 1}
    env = server_env(WeaviateSettings(), ports=ports, bind="B", **where)
    assert {key: env[key] for key in env if key.endswith(("BIND_ADDR", "BIND_HOST"))} == {
        "CLUSTER_BIND_ADDR": "B",
        "GRPC_BIND_HOST": "B",
        "CLUSTER_DATA_BIND_HOST": "B",
    }
    # ... and the patch reads exactly those names
    patch = (REPO / "scripts/weaviate/listen-host.patch").read_text()
    assert 'os.Getenv("GRPC_BIND_HOST")' in patch
    assert patch.count('os.Getenv("CLUSTER_DATA_BIND_HOST")') == 2  # the cluster API's HTTP and gRPC servers


FAKE_GO = r"""#!/bin/sh
# Stands in for go: names the fake module source, "builds" by checking the patch is applied.
echo "$*" >>"$(dirname "$0")/calls"
case "$1" in
mod) printf '{\n\t"Dir": "%s",\n}\n' "$FAKE_SRC" ;;
build)
  grep -q 'os.Getenv("GRPC_BIND_HOST")' adapters/handlers/grpc/server.go || exit 1
  while [ "$1" != -o ]; do shift; done; printf '#!/bin/sh\n' >"$2"; chmod +x "$2" ;;
esac
"""


def unpatched_source(patch: str, root: Path) -> None:
    """The files ``patch`` changes, made of its hunks' old lines only (patch applies them at an offset)."""
    old: dict[str, list[str]] = {}
    name = ""
    for line in patch.splitlines(keepends=True):
        if line.startswith("--- a/"):
            name = line[len("--- a/") :].strip()
            old[name] = []
        elif name and line[:1] in (" ", "-") and not line.startswith("--- "):
            old[name].append(line[1:])
    for name, lines in old.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("".join(lines))


def test_weaviate_build_runs_again_only_when_the_patch_or_version_changed(tmp_path: Path) -> None:
    """scripts/weaviate/build.sh with a stand-in go: it builds the patched source, records what it built,
    does nothing while that record matches, and builds again when the patch or the version changed."""
    repo, fakebin, src = tmp_path / "repo", tmp_path / "fakebin", tmp_path / "src"
    (repo / "scripts/weaviate").mkdir(parents=True)
    for name in ("build.sh", "listen-host.patch"):
        shutil.copy2(REPO / "scripts/weaviate" / name, repo / "scripts/weaviate" / name)
    patch_file = repo / "scripts/weaviate/listen-host.patch"
    unpatched_source(patch_file.read_text(), src)
    fakebin.mkdir()
    (fakebin / "go").write_text(FAKE_GO)
    (fakebin / "go").chmod(0o755)
    out, calls = tmp_path / "bin/weaviate-server", fakebin / "calls"

    def start(version: str, path: str, target: Path | str) -> subprocess.Popen:
        env = {**os.environ, "PATH": path, "FAKE_SRC": str(src)}
        env.pop("CGO_ENABLED", None)
        argv = [str(repo / "scripts/weaviate/build.sh"), version, str(target)]
        return subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=PIPE, stderr=PIPE, text=True)

    def build(version: str = "v1.36.0", path: str = f"{fakebin}:/usr/bin:/bin", target=out) -> str:
        proc = start(version, path, target)
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
        return stdout + stderr

    def builds() -> int:
        return calls.read_text().count("build -buildvcs=false -o") if calls.exists() else 0

    assert "built" in build() and builds() == 1
    sha = hashlib.sha256(patch_file.read_bytes()).hexdigest()
    assert f"v1.36.0 patch-sha256 {sha} " in Path(f"{out}.build").read_text()
    assert os.access(out, os.X_OK) and not list((repo / ".build").glob("weaviate-src*"))
    assert build() == "" and builds() == 1  # up to date: nothing to do
    patch_file.write_text("A changed header.\n" + patch_file.read_text())
    assert "built" in build() and builds() == 2  # the patch changed
    assert "built" in build("v1.36.1") and builds() == 3  # another version
    assert build("v1.36.1") == "" and builds() == 3
    # two builds at once (make -j): one builds, the other waits for it and finds it done
    (fakebin / "go").write_text(FAKE_GO.replace("build)\n", "build)\n  sleep 1\n"))
    both = [start("v1.36.2", f"{fakebin}:/usr/bin:/bin", out) for _ in range(2)]
    assert [p.wait(timeout=60) for p in both] == [0, 0] and builds() == 4
    # a relative OUT is taken from the caller's directory, not the build's
    assert "built" in build(target="rel/weaviate-server") and (tmp_path / "rel/weaviate-server").is_file()
    if not any(Path(d, "go").exists() for d in ("/usr/bin", "/bin")):  # without Go: no failure, but say so
        assert "is not the patched build of v1.36.0" in build("v1.36.0", "/usr/bin:/bin")  # a stale binary
        out.unlink()
        assert "Go not found" in build("v1.36.0", "/usr/bin:/bin")
