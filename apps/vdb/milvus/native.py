"""Milvus standalone as an HPC rank without Apptainer (``vdb.cluster.runtime: native``).

The rank runs ``python -m apps.vdb.milvus.native``: it renders the ``milvus`` package's 2.3 config with
the ports the layout planned, then replaces itself with the bundled server (``exec``), so the rank script
signals and waits on the server itself. :func:`plan_native_standalone` plans that rank; it is what the
local Slurm testbed runs (docs/slurm-local.md).
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
from apps.vdb.milvus.env import server_env

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
        ready_url=f"http://127.0.0.1:{ports['metrics']}/healthz",  # metrics listen on every address
        workdir=rank_dir,
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
    opts = parser.parse_args(args)
    try:
        settings = MilvusSettings(binary=opts.binary, binary_cache_dir=opts.cache_dir)
        exe, libdir = server_binary(settings)
        opts.base.mkdir(parents=True, exist_ok=True)
        write_config(opts.base, opts.overrides, None, fixed=opts.ports)
    except (DatabaseError, OSError) as exc:
        sys.exit(f"milvus rank: {exc}")
    env = {
        **os.environ,
        "MILVUSCONF": str(opts.base / "configs"),
        "MILVUS_RUN_DIR": str(opts.base / "run"),
        "LD_LIBRARY_PATH": f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}",
    }
    os.execve(exe, [str(exe), "run", "standalone"], env)


if __name__ == "__main__":
    main()
