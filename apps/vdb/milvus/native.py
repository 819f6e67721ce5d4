"""Milvus standalone as an HPC rank without Apptainer (``vdb.cluster.runtime: native``).

The rank runs ``python -m apps.vdb.milvus.native``: it renders the ``milvus`` package's 2.3 config with
the ports the layout planned, then replaces itself with the bundled server (``exec``), so the rank script
signals and waits on the server itself. :func:`plan_native_standalone` plans that rank; it is what the
local Slurm testbed runs (docs/slurm-local.md).

Root's password: 2.3.5 cannot be given one at start, so before the exec a detached helper process is
forked that waits for the proxy, changes root's password from the default to the one in the rank's run
directory (0600, made once) and only then leaves the ready marker the rank script waits for, so clients
never find the server with the default password (the window before the change remains; see
:mod:`apps.vdb.milvus.deploy`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
from pathlib import Path
from typing import Any

from apps.vdb.base import DatabaseError
from apps.vdb.cluster.config import DatabaseClusterConfig
from apps.vdb.cluster.layout import common_env, rank_ports
from apps.vdb.cluster.spec import RankPlan, RankSpec
from apps.vdb.milvus.env import PASSWORD_FILE, server_env
from apps.vdb.secret import new_secret

SECURE_TIMEOUT_S = 600.0  # the helper's wait for the proxy (the rank's own startup timeout ends it sooner)

# The package template's port keys (``<name>_port``), then the two the deployment adds.
PORTS = [
    "proxy",
    "metrics",
    "etcd",
    "etcd_peer",
    "root_coord",
    "proxy_internal",
    "query_coord",
    "query_node",
    "index_coord",
    "index_node",
    "data_coord",
    "data_node",
]


def plan_native_standalone(
    settings: Any, cluster: DatabaseClusterConfig, data: str, executable: str | None
) -> RankPlan:
    """One standalone rank started from this interpreter's environment (the nodes share its file system);
    ``executable`` (``vdb.cluster.executables.milvus``) replaces the package's bundled server."""
    from apps.vdb.milvus.deploy import server_overrides

    if cluster.milvus.mode != "standalone":
        raise DatabaseError("vdb.cluster.milvus.mode: runtime native runs Milvus standalone only")
    if cluster.port_stride < len(PORTS):
        raise DatabaseError(
            f"vdb.cluster.port_stride: Milvus standalone needs {len(PORTS)} ports per rank under runtime "
            f"native; got {cluster.port_stride}"
        )
    ports = rank_ports(cluster, 0, PORTS)
    rank_dir = f"{data}/rank-000"
    argv = [sys.executable, "-m", "apps.vdb.milvus.native", "--base", rank_dir]
    argv += ["--ports", json.dumps({f"{name}_port": port for name, port in ports.items()})]
    argv += ["--overrides", json.dumps(server_overrides(settings, "${VDB_ADDR}"))]
    # the password by its file only (a command line is visible to every user of the node)
    argv += ["--password-file", f"${{VDB_RANK_DIR}}/run/{PASSWORD_FILE}", "--ready", f"{rank_dir}/ready"]
    if executable or settings.binary:
        argv += ["--binary", executable or settings.binary]
    if settings.binary_cache_dir:
        argv += ["--cache-dir", settings.binary_cache_dir]
    spec = RankSpec(
        rank=0,
        role="standalone",
        ports=ports,
        client_port="proxy",
        image=f"milvus {_package_version()} (the PyPI package's standalone server)",
        argv=argv,
        env={**common_env(cluster), **server_env(settings, "STANDALONE", {}, ports["metrics"])},
        binds=[],
        data_dir=rank_dir,
        ready_url=f"file://{rank_dir}/ready",  # left once root has its password (see main)
        workdir=rank_dir,
        client_files={"password_file": f"run/{PASSWORD_FILE}"},
    )
    return RankPlan([spec], [0], native=True)


def _package_version() -> str:
    try:
        return importlib.metadata.version("milvus")
    except importlib.metadata.PackageNotFoundError:
        return "(package not installed)"


def main(args: list[str] | None = None) -> None:
    """Render the config under ``--base`` and exec the server (never returns unless it fails)."""
    from apps.vdb.milvus.deploy import server_binary, write_config
    from apps.vdb.milvus.settings import MilvusSettings

    parser = argparse.ArgumentParser(prog="python -m apps.vdb.milvus.native")
    parser.add_argument("--base", required=True, type=Path)
    parser.add_argument("--ports", required=True, type=json.loads)
    parser.add_argument("--overrides", required=True, type=json.loads)
    parser.add_argument("--binary")
    parser.add_argument("--cache-dir")
    parser.add_argument("--password-file", type=Path, help="root's password (made when missing)")
    parser.add_argument("--ready", type=Path, help="marker left once root has that password")
    opts = parser.parse_args(args)
    try:
        settings = MilvusSettings(binary=opts.binary, binary_cache_dir=opts.cache_dir)
        exe, libdir = server_binary(settings)
        opts.base.mkdir(parents=True, exist_ok=True)
        write_config(opts.base, opts.overrides, None, fixed=opts.ports)
        if opts.password_file is not None and not opts.password_file.is_file():
            new_secret(opts.password_file)
    except (DatabaseError, OSError) as exc:
        sys.exit(f"milvus rank: {exc}")
    if opts.password_file is not None:
        # Milvus 2.3.5 listens on every interface: loopback reaches its proxy.
        uri = f"http://127.0.0.1:{opts.ports['proxy_port']}"
        _secure_root_detached(uri, opts.password_file, opts.ready)
    env = {
        **os.environ,
        "MILVUSCONF": str(opts.base / "configs"),
        "MILVUS_RUN_DIR": str(opts.base / "run"),
        "LD_LIBRARY_PATH": f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}",
    }
    os.execve(exe, [str(exe), "run", "standalone"], env)


def _secure_root_detached(uri: str, password_file: Path, ready: Path | None) -> None:
    """Fork a detached helper (reparented to init: the server never reaps it) that sets root's password
    once the proxy answers, then leaves ``ready``; its errors go to the rank's log."""
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    code = 1
    try:
        if os.fork():  # the grandchild does the work
            code = 0
        else:
            from apps.vdb.milvus.deploy import secure_root

            secure_root(uri, password_file, SECURE_TIMEOUT_S)
            if ready is not None:
                ready.touch()
            code = 0
    except BaseException as exc:
        print(f"milvus rank: {exc}", file=sys.stderr, flush=True)
    finally:
        os._exit(code)  # never return into main: only the first process execs the server


if __name__ == "__main__":
    main()
