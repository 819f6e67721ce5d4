"""Milvus on an HPC pilot job: standalone (embedded etcd), or etcd + mixcoord + proxy / streaming / query /
data nodes sharing a Lustre or DAOS directory instead of MinIO (the study's HPC deployment).

Listen addresses: etcd (embedded or its own rank) listens on loopback and, where other ranks need it, on the
rank's interface address only. Milvus's own gRPC and metrics listeners cannot be placed: every version up to
2.6 opens them with ``net.Listen("tcp", ":<port>")`` (``<section>.ip`` is only the address advertised in
etcd), so they listen on every interface of the compute node; see :mod:`apps.vdb.milvus.deploy`.

Authentication: every Milvus rank has authorization on (``common.security.authorizationEnabled``, in its
environment and user.yaml), and the rank that creates root (standalone, or mixcoord's root coordinator)
starts from a start script (:func:`apps.vdb.secret.start_script`) that makes a random password once in its
run directory (0600) and exports it as ``common.security.defaultRootPassword`` (2.4 and later), so root
never has Milvus's default password and the password is in no rendered file. The clients read that file
(``client_files``; a proxy's names mixcoord's). Runtime native (2.3.5): :mod:`apps.vdb.milvus.native`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apps.vdb.base import DatabaseError
from apps.vdb.cluster.config import DatabaseClusterConfig
from apps.vdb.cluster.layout import absolute, common_env, in_memory, rank_ports
from apps.vdb.cluster.spec import RankPlan, RankSpec
from apps.vdb.milvus.env import AUTH_VAR, PASSWORD_FILE, ROOT_PASSWORD_VAR, server_env
from apps.vdb.secret import start_script

RUN = "/opt/pes2o/run"  # the rank's run directory (start script, root's password) inside the container
START = "start-milvus.sh"


def _auth() -> dict[str, Any]:
    """user.yaml's authorization switch, merged after the user's overrides: always on (a fresh dict per
    rank, so no YAML file shares nodes with another)."""
    return {"common": {"security": {"authorizationEnabled": True}}}


def _root_start(command: list[str]) -> tuple[list[str], dict[str, str]]:
    """The argv that runs ``command`` through the start script making root's password, and its file."""
    return ["/bin/sh", f"{RUN}/{START}", RUN, *command], {
        START: start_script("milvus", ROOT_PASSWORD_VAR, PASSWORD_FILE)
    }


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _milvus_standalone(
    settings: Any, cluster: DatabaseClusterConfig, image: str, data: str
) -> list[RankSpec]:
    ports = rank_ports(cluster, 0, ["proxy", "metrics", "etcd", "etcd_peer", "proxy_internal"])
    rank_dir = f"{data}/rank-000"
    user = {
        "proxy": {"port": ports["proxy"], "internalPort": ports["proxy_internal"]},
        "etcd": {"endpoints": [f"127.0.0.1:{ports['etcd']}"]},
        "common": {"storageType": "local"},
        "localStorage": {"path": "/var/lib/milvus/data"},
        "mq": {"type": "woodpecker"},
        "woodpecker": {"storage": {"type": "local", "rootPath": "/var/lib/milvus/woodpecker"}},
    }
    _merge(user, _overrides(settings))
    _merge(user, _auth())
    embed_etcd = {
        "listen-client-urls": f"http://127.0.0.1:{ports['etcd']}",  # only the server in this rank uses it
        "advertise-client-urls": f"http://127.0.0.1:{ports['etcd']}",
        "listen-peer-urls": f"http://127.0.0.1:{ports['etcd_peer']}",
        "initial-advertise-peer-urls": f"http://127.0.0.1:{ports['etcd_peer']}",
        "initial-cluster": f"default=http://127.0.0.1:{ports['etcd_peer']}",
        "quota-backend-bytes": 4294967296,
        "auto-compaction-mode": "revision",
        "auto-compaction-retention": "1000",
    }
    etcd = {
        "ETCD_USE_EMBED": "true",
        "ETCD_DATA_DIR": "/var/lib/etcd",  # bound to tmpfs below, whatever the medium
        "ETCD_CONFIG_PATH": "/milvus/configs/embedEtcd.yaml",
        "COMMON_STORAGETYPE": "local",
        AUTH_VAR: "true",
    }
    env = {**common_env(cluster), **server_env(settings, "STANDALONE", etcd, ports["metrics"])}
    argv, start = _root_start(["milvus", "run", "standalone"])
    return [
        RankSpec(
            rank=0,
            role="standalone",
            ports=ports,
            client_port="proxy",
            image=image,
            argv=argv,
            env=env,
            binds=[
                (rank_dir, "/var/lib/milvus"),
                (in_memory(cluster, f"{rank_dir}/etcd"), "/var/lib/etcd"),
                ("${VDB_RANK_DIR}/user.yaml", "/milvus/configs/user.yaml"),
                ("${VDB_RANK_DIR}/embedEtcd.yaml", "/milvus/configs/embedEtcd.yaml"),
                ("${VDB_RANK_DIR}", RUN),  # its run directory: start script and root's password
            ],
            data_dir=rank_dir,
            ready_url=f"http://127.0.0.1:{ports['metrics']}/healthz",
            files={"user.yaml": _yaml(user), "embedEtcd.yaml": _yaml(embed_etcd), **start},
            apptainer_flags=["--pwd", "/milvus"],
            client_files={"password_file": f"run/{PASSWORD_FILE}"},
        )
    ]


def _overrides(settings: Any) -> dict[str, Any]:
    """The adapter's dotted milvus.yaml overrides as nested YAML (they win over ours)."""
    nested: dict[str, Any] = {}
    for key, value in settings.config_overrides.items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Merge nested ``overrides`` into ``base`` key by key (an override of proxy.x keeps proxy's ports)."""
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


# Milvus role -> (milvus.yaml section holding ip/port, `milvus run` argument)
_MILVUS_ROLES = {
    "mixcoord": (None, "mixcoord"),
    "proxy": ("proxy", "proxy"),
    "streamingnode": ("streamingNode", "streamingnode"),
    "querynode": ("queryNode", "querynode"),
    "datanode": ("dataNode", "datanode"),
}


def _milvus_distributed(
    settings: Any, cluster: DatabaseClusterConfig, image: str, etcd_image: str, data: str, shared: str
) -> list[RankSpec]:
    m = cluster.milvus
    roles = (
        ["etcd", "mixcoord"]
        + ["proxy"] * m.proxies
        + ["streamingnode"] * m.streaming_nodes
        + ["querynode"] * m.query_nodes
        + ["datanode"] * m.data_nodes
    )
    etcd_ports = rank_ports(cluster, 0, ["client", "peer", "metrics"])
    # The proxies' clients read root's password where mixcoord made it (its run directory, shared FS).
    password = f"../{roles.index('mixcoord'):03d}/run/{PASSWORD_FILE}"
    ranks: list[RankSpec] = []
    for r, role in enumerate(roles):
        rank_dir = f"{data}/rank-{r:03d}"
        if role == "etcd":
            p = etcd_ports
            argv = [
                "etcd",
                "--name=etcd0",
                "--data-dir=/etcd-data",
                # loopback for the readiness probe, the interface for the other ranks; nothing else
                f"--listen-client-urls=http://127.0.0.1:{p['client']},http://${{VDB_ADDR}}:{p['client']}",
                f"--advertise-client-urls=http://${{VDB_ADDR}}:{p['client']}",
                f"--listen-peer-urls=http://${{VDB_ADDR}}:{p['peer']}",
                f"--initial-advertise-peer-urls=http://${{VDB_ADDR}}:{p['peer']}",
                f"--initial-cluster=etcd0=http://${{VDB_ADDR}}:{p['peer']}",
                f"--listen-metrics-urls=http://127.0.0.1:{p['metrics']}",
                "--auto-compaction-mode=revision",
                "--auto-compaction-retention=1000",
                "--quota-backend-bytes=4294967296",
            ]
            ranks.append(
                RankSpec(
                    rank=r,
                    role=role,
                    ports=p,
                    client_port="client",
                    image=etcd_image,
                    argv=argv,
                    env={},
                    binds=[(in_memory(cluster, rank_dir), "/etcd-data")],  # tmpfs, never Lustre or DAOS
                    data_dir=in_memory(cluster, rank_dir),
                    ready_url=f"http://127.0.0.1:{p['client']}/health",
                )
            )
            continue
        p = rank_ports(cluster, r, ["grpc", "metrics", "internal"])
        section, command = _MILVUS_ROLES[role]
        user: dict[str, Any] = {
            "etcd": {"endpoints": [f"@VDB_RANK0_ADDR@:{etcd_ports['client']}"], "rootPath": "pes2o-vdb"},
            "common": {"storageType": "local"},
            "localStorage": {"path": "/var/lib/milvus/shared/data"},  # the shared directory replaces MinIO
            "mq": {"type": "woodpecker"},
            "woodpecker": {"storage": {"type": "local", "rootPath": "/var/lib/milvus/shared/woodpecker"}},
        }
        if section is None:  # the coordinator: every coordinator section advertises this rank
            for coord in ("rootCoord", "queryCoord", "dataCoord"):
                user[coord] = {"ip": "@VDB_ADDR@"}
        else:
            user[section] = {"ip": "@VDB_ADDR@", "port": p["grpc"]}
            if role == "proxy":
                user[section]["internalPort"] = p["internal"]
        _merge(user, _overrides(settings))
        _merge(user, _auth())
        storage = {"COMMON_STORAGETYPE": "local", AUTH_VAR: "true"}
        env = {**common_env(cluster), **server_env(settings, "CLUSTER", storage, p["metrics"])}
        argv, files = ["milvus", "run", command], {"user.yaml": _yaml(user)}
        binds = [
            (rank_dir, "/var/lib/milvus"),
            (shared, "/var/lib/milvus/shared"),
            ("${VDB_RANK_DIR}/user.yaml", "/milvus/configs/user.yaml"),
        ]
        if role == "mixcoord":  # its root coordinator creates root: with the password of the start script
            argv, start = _root_start(argv)
            files.update(start)
            binds.append(("${VDB_RANK_DIR}", RUN))
        ranks.append(
            RankSpec(
                rank=r,
                role=role,
                ports=p,
                client_port="grpc",
                image=image,
                argv=argv,
                env=env,
                binds=binds,
                data_dir=rank_dir,
                ready_url=f"http://127.0.0.1:{p['metrics']}/healthz",
                waits_for_rank0=True,
                files=files,
                apptainer_flags=["--pwd", "/milvus"],
                client_files={"password_file": password} if role == "proxy" else {},
            )
        )
    return ranks


def image_field(cluster: DatabaseClusterConfig, settings: Any = None) -> str:
    """The ``vdb.cluster.images`` field Milvus runs from."""
    return "milvus"


def plan_ranks(
    settings: Any, cluster: DatabaseClusterConfig, image: str, data: str, base_dir: Path | None
) -> RankPlan:
    """Standalone: one rank. Distributed: clients connect to the proxies, which share ``data/shared``.

    Runtime native: the standalone server of the ``milvus`` package (or ``image``, an executable).
    """
    if cluster.runtime == "native":
        from apps.vdb.milvus.native import plan_native_standalone

        return plan_native_standalone(settings, cluster, data, image or None)
    if cluster.milvus.mode == "standalone":
        return RankPlan(_milvus_standalone(settings, cluster, image, data), [0])
    if not cluster.images.get("etcd"):
        raise DatabaseError("vdb.cluster.images.etcd: milvus distributed needs an etcd image")
    shared = f"{data}/shared"
    etcd_image = str(absolute(cluster.images.get("etcd"), base_dir))
    ranks = _milvus_distributed(settings, cluster, image, etcd_image, data, shared)
    return RankPlan(ranks, [r.rank for r in ranks if r.role == "proxy"], shared)
