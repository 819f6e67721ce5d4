"""A vector-database cluster as a pilot job: Apptainer servers on the nodes of their own batch job.

Planning (pure, unit-tested here) and running (needs a scheduler, Apptainer and the images) are split:

* :func:`plan_cluster` lays out the ranks of one database: role, node slot, bound cores, ports, data
  directory, container environment and command. Qdrant: rank 0 starts with its p2p URI, the others
  bootstrap from it. Weaviate: one node name and port set per rank, gossip join to rank 0, raft join list
  of every rank. Milvus: standalone (embedded etcd), or etcd + mixcoord + proxy / streaming / query / data
  nodes sharing a Lustre or DAOS directory instead of MinIO (the study's HPC deployment).
* :func:`render_files` turns a layout into shell scripts: a shared ``lib.sh``, one ``rank-NNN.sh`` and
  ``.env`` per rank, ``launch.sh`` (picks the script for the MPI rank) and the job command
  (``mpiexec``/``srun`` with CPU binding, or a local loop).
* :class:`ClusterDeployment` submits that command with a Parsl provider (PBS Pro, Slurm, or local), reads
  the endpoint registry (``registry/rank-NNN.json``, rank -> host and ports, written by each rank on the
  shared file system), waits until every rank is healthy, returns :class:`Endpoints`, and on ``stop``
  asks every rank to stop (``registry/STOP``) before cancelling the job.

Ranks learn their own address at run time (the configured interface), so the only cross-rank value a
rank needs, rank 0's address, is read from the registry rather than guessed from host names.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apps.vdb.base import DatabaseError, Deployment, Endpoint, Endpoints
from apps.vdb.process import tail
from pipeline.config_hpc import DatabaseClusterConfig, NodeShape, bind_lists, image_for

REGISTRY = "registry"
STOP_FILE = "STOP"
CLUSTER_DIR = "cluster"


@dataclass
class RankSpec:
    """One server process of a cluster, fully decided at plan time except for run-time addresses.

    Strings may reference ``${VDB_ADDR}`` (this rank's address) and ``${VDB_RANK0_ADDR}`` (rank 0's,
    read from the registry): the rank script substitutes both before starting the container.
    """

    rank: int
    role: str
    ports: dict[str, int]
    client_port: str  # the ports key clients connect to
    image: str
    argv: list[str]
    env: dict[str, str]
    binds: list[tuple[str, str]]  # (host path, container path)
    data_dir: str
    ready_url: str  # polled on 127.0.0.1 until it answers 2xx
    up_port: str | None = None  # a port whose opening lets others join before ready (Weaviate gossip)
    waits_for_rank0: bool = False
    node_slot: int = 0
    local_index: int = 0
    cores: list[int] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # config files (name -> text) bound into it
    apptainer_flags: list[str] = field(default_factory=list)


@dataclass
class ClusterLayout:
    """Every rank of one database cluster and where its scripts, registry and data live."""

    database: str
    cluster_id: str
    directory: Path  # scripts, registry and logs (shared file system)
    data_root: str  # per-rank data lives under it
    ranks: list[RankSpec]
    entry_ranks: list[int]  # ranks clients connect to, preferred first
    shared_data: str | None = None  # Milvus distributed: the directory every rank shares

    @property
    def registry(self) -> Path:
        return self.directory / REGISTRY

    def to_json(self) -> dict[str, Any]:
        """The plan as data (rank -> role, slot, cores, ports), for ``plan`` and provenance."""
        return {
            "database": self.database,
            "cluster_id": self.cluster_id,
            "directory": str(self.directory),
            "ranks": [
                {
                    "rank": r.rank,
                    "role": r.role,
                    "node_slot": r.node_slot,
                    "cores": _ranges(r.cores),
                    "ports": r.ports,
                    "data_dir": r.data_dir,
                }
                for r in self.ranks
            ],
            "entry_ranks": self.entry_ranks,
        }


# --- layout ------------------------------------------------------------------------------------------------


def cluster_id_for(database: str, workdir: Path) -> str:
    """A short, stable id: the same deployment directory always gets the same data directories."""
    digest = hashlib.sha1(str(workdir).encode()).hexdigest()[:8]
    return f"{database}-{digest}"


def _ports(cluster: DatabaseClusterConfig, rank: int, names: list[str]) -> dict[str, int]:
    """Distinct ports for every rank: rank r owns base_port + r*stride ... + stride-1."""
    first = cluster.base_port + rank * cluster.port_stride
    return {name: first + i for i, name in enumerate(names)}


def _common_env(cluster: DatabaseClusterConfig) -> dict[str, str]:
    # Go servers do not follow CPU affinity; the study capped them with GOMAXPROCS = cores per worker.
    return {"GOMAXPROCS": str(cluster.cores_per_worker)}


def _qdrant(settings: Any, cluster: DatabaseClusterConfig, image: str, data: str) -> list[RankSpec]:
    ranks = []
    p2p0 = _ports(cluster, 0, ["http", "grpc", "p2p"])["p2p"]
    for r in range(cluster.workers):
        ports = _ports(cluster, r, ["http", "grpc", "p2p"])
        rank_dir = f"{data}/rank-{r:03d}"
        env = {
            "QDRANT__SERVICE__HOST": "0.0.0.0",
            "QDRANT__SERVICE__HTTP_PORT": str(ports["http"]),
            "QDRANT__SERVICE__GRPC_PORT": str(ports["grpc"]),
            "QDRANT__CLUSTER__ENABLED": "true",
            "QDRANT__CLUSTER__P2P__PORT": str(ports["p2p"]),
            "QDRANT__STORAGE__STORAGE_PATH": "/qdrant/storage",
            "QDRANT__STORAGE__SNAPSHOTS_PATH": "/qdrant/snapshots",
            "QDRANT__TELEMETRY_DISABLED": "true",
        }
        if cluster.gpu_indexing:
            env["QDRANT__GPU__INDEXING"] = "true"
        argv = ["/qdrant/qdrant", "--uri", f"http://${{VDB_ADDR}}:{ports['p2p']}"]
        if r > 0:  # joiners bootstrap from rank 0's p2p URI
            argv += ["--bootstrap", f"http://${{VDB_RANK0_ADDR}}:{p2p0}"]
        flags = ["--writable-tmpfs", "--pwd", "/qdrant"] + (["--nv"] if cluster.gpu_indexing else [])
        ranks.append(
            RankSpec(
                rank=r,
                role="peer",
                ports=ports,
                client_port="http",
                image=image,
                argv=argv,
                env=env,
                binds=[
                    (f"{rank_dir}/storage", "/qdrant/storage"),
                    (f"{rank_dir}/snapshots", "/qdrant/snapshots"),
                ],
                data_dir=rank_dir,
                ready_url=f"http://127.0.0.1:{ports['http']}/readyz",
                waits_for_rank0=r > 0,
                apptainer_flags=flags,
            )
        )
    return ranks


def _weaviate(settings: Any, cluster: DatabaseClusterConfig, image: str, data: str) -> list[RankSpec]:
    names = ["http", "grpc", "gossip", "data", "raft", "raft_rpc"]
    all_ports = [_ports(cluster, r, names) for r in range(cluster.workers)]
    # Per-node raft ports (several ranks per node) need Weaviate's node->port map, which it builds from
    # RAFT_JOIN only in CLUSTER_IN_LOCALHOST mode; addresses still come from gossip (CLUSTER_ADVERTISE_ADDR).
    raft_join = ",".join(f"node{r}:{p['raft']}" for r, p in enumerate(all_ports))
    ranks = []
    for r, ports in enumerate(all_ports):
        env = {
            **_common_env(cluster),
            "AUTHENTICATION_ANONYMOUS_ACCESS_ENABLED": "true",
            "PERSISTENCE_DATA_PATH": "/var/lib/weaviate",
            "DEFAULT_VECTORIZER_MODULE": "none",
            "CLUSTER_HOSTNAME": f"node{r}",
            "CLUSTER_ADVERTISE_ADDR": "${VDB_ADDR}",
            "CLUSTER_GOSSIP_BIND_PORT": str(ports["gossip"]),
            "CLUSTER_DATA_BIND_PORT": str(ports["data"]),
            "CLUSTER_IN_LOCALHOST": "true",
            "RAFT_PORT": str(ports["raft"]),
            "RAFT_INTERNAL_RPC_PORT": str(ports["raft_rpc"]),
            "RAFT_JOIN": raft_join,
            "RAFT_BOOTSTRAP_EXPECT": str(cluster.workers),
            "RAFT_TIMEOUTS_MULTIPLIER": str(settings.raft_timeouts_multiplier),
            "GRPC_PORT": str(ports["grpc"]),
            "ASYNC_INDEXING": str(settings.async_indexing).lower(),
            "DISABLE_TELEMETRY": "true",
            "GO_PROFILING_DISABLE": "true",
            **settings.env,
        }
        if r > 0:
            env["CLUSTER_JOIN"] = f"${{VDB_RANK0_ADDR}}:{all_ports[0]['gossip']}"
        rank_dir = f"{data}/rank-{r:03d}"
        ranks.append(
            RankSpec(
                rank=r,
                role="node",
                ports=ports,
                client_port="http",
                image=image,
                argv=["/bin/weaviate", "--host", "0.0.0.0", "--port", str(ports["http"]), "--scheme", "http"],
                env=env,
                binds=[(rank_dir, "/var/lib/weaviate")],
                data_dir=rank_dir,
                ready_url=f"http://127.0.0.1:{ports['http']}/v1/.well-known/ready",
                up_port="gossip",  # joiners exit when rank 0's gossip port is not listening yet
                waits_for_rank0=r > 0,
            )
        )
    return ranks


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _milvus_standalone(
    settings: Any, cluster: DatabaseClusterConfig, image: str, data: str
) -> list[RankSpec]:
    ports = _ports(cluster, 0, ["proxy", "metrics", "etcd", "etcd_peer", "proxy_internal"])
    rank_dir = f"{data}/rank-000"
    user = {
        "proxy": {"port": ports["proxy"], "internalPort": ports["proxy_internal"]},
        "etcd": {"endpoints": [f"127.0.0.1:{ports['etcd']}"]},
        "common": {"storageType": "local"},
        "localStorage": {"path": "/var/lib/milvus/data"},
        "mq": {"type": "woodpecker"},
        "woodpecker": {"storage": {"type": "local", "rootPath": "/var/lib/milvus/woodpecker"}},
        **_overrides(settings),
    }
    embed_etcd = {
        "listen-client-urls": f"http://0.0.0.0:{ports['etcd']}",
        "advertise-client-urls": f"http://127.0.0.1:{ports['etcd']}",
        "listen-peer-urls": f"http://127.0.0.1:{ports['etcd_peer']}",
        "initial-advertise-peer-urls": f"http://127.0.0.1:{ports['etcd_peer']}",
        "initial-cluster": f"default=http://127.0.0.1:{ports['etcd_peer']}",
        "quota-backend-bytes": 4294967296,
        "auto-compaction-mode": "revision",
        "auto-compaction-retention": "1000",
    }
    env = {
        **_common_env(cluster),
        "DEPLOY_MODE": "STANDALONE",
        "ETCD_USE_EMBED": "true",
        "ETCD_DATA_DIR": "/var/lib/milvus/etcd",
        "ETCD_CONFIG_PATH": "/milvus/configs/embedEtcd.yaml",
        "COMMON_STORAGETYPE": "local",
        "METRICS_PORT": str(ports["metrics"]),
        **settings.env,
    }
    return [
        RankSpec(
            rank=0,
            role="standalone",
            ports=ports,
            client_port="proxy",
            image=image,
            argv=["milvus", "run", "standalone"],
            env=env,
            binds=[
                (rank_dir, "/var/lib/milvus"),
                ("${VDB_RANK_DIR}/user.yaml", "/milvus/configs/user.yaml"),
                ("${VDB_RANK_DIR}/embedEtcd.yaml", "/milvus/configs/embedEtcd.yaml"),
            ],
            data_dir=rank_dir,
            ready_url=f"http://127.0.0.1:{ports['metrics']}/healthz",
            files={"user.yaml": _yaml(user), "embedEtcd.yaml": _yaml(embed_etcd)},
            apptainer_flags=["--pwd", "/milvus"],
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
    etcd_ports = _ports(cluster, 0, ["client", "peer", "metrics"])
    ranks: list[RankSpec] = []
    for r, role in enumerate(roles):
        rank_dir = f"{data}/rank-{r:03d}"
        if role == "etcd":
            p = etcd_ports
            argv = [
                "etcd",
                "--name=etcd0",
                "--data-dir=/etcd-data",
                f"--listen-client-urls=http://0.0.0.0:{p['client']}",
                f"--advertise-client-urls=http://${{VDB_ADDR}}:{p['client']}",
                f"--listen-peer-urls=http://0.0.0.0:{p['peer']}",
                f"--initial-advertise-peer-urls=http://${{VDB_ADDR}}:{p['peer']}",
                f"--initial-cluster=etcd0=http://${{VDB_ADDR}}:{p['peer']}",
                f"--listen-metrics-urls=http://0.0.0.0:{p['metrics']}",
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
                    binds=[(rank_dir, "/etcd-data")],
                    data_dir=rank_dir,
                    ready_url=f"http://127.0.0.1:{p['client']}/health",
                )
            )
            continue
        p = _ports(cluster, r, ["grpc", "metrics", "internal"])
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
        user.update(_overrides(settings))
        env = {
            **_common_env(cluster),
            "DEPLOY_MODE": "CLUSTER",
            "COMMON_STORAGETYPE": "local",
            "METRICS_PORT": str(p["metrics"]),
            **settings.env,
        }
        ranks.append(
            RankSpec(
                rank=r,
                role=role,
                ports=p,
                client_port="grpc",
                image=image,
                argv=["milvus", "run", command],
                env=env,
                binds=[
                    (rank_dir, "/var/lib/milvus"),
                    (shared, "/var/lib/milvus/shared"),
                    ("${VDB_RANK_DIR}/user.yaml", "/milvus/configs/user.yaml"),
                ],
                data_dir=rank_dir,
                ready_url=f"http://127.0.0.1:{p['metrics']}/healthz",
                waits_for_rank0=True,
                files={"user.yaml": _yaml(user)},
                apptainer_flags=["--pwd", "/milvus"],
            )
        )
    return ranks


def plan_cluster(
    settings: Any,
    cluster: DatabaseClusterConfig,
    node: NodeShape,
    workdir: Path,
    base_dir: Path | None = None,
) -> ClusterLayout:
    """Lay out every rank of ``settings.name`` on the cluster block (no side effects)."""
    database = settings.name
    cluster = cluster.for_database(database)
    cid = cluster_id_for(database, workdir)
    storage_base = cluster.storage.base_dir()
    if not storage_base:
        raise DatabaseError(
            f"vdb.cluster.storage: medium {cluster.storage.medium} has no directory configured"
        )
    data = f"{storage_base.rstrip('/')}/pes2o-vdb/{cid}"
    _, image = image_for(cluster, database)
    if not image:
        raise DatabaseError(f"vdb.cluster.images: no Apptainer image for {database}")
    image = str(_abs(image, base_dir))
    shared = None
    entry = [0]
    if database == "qdrant":
        ranks = _qdrant(settings, cluster, image, data)
        entry = list(range(len(ranks)))
    elif database == "weaviate":
        ranks = _weaviate(settings, cluster, image, data)
        entry = list(range(len(ranks)))
    elif database == "milvus" and cluster.milvus.mode == "standalone":
        ranks = _milvus_standalone(settings, cluster, image, data)
    elif database == "milvus":
        if not cluster.images.etcd:
            raise DatabaseError("vdb.cluster.images.etcd: milvus distributed needs an etcd image")
        shared = f"{data}/shared"
        ranks = _milvus_distributed(
            settings, cluster, image, str(_abs(cluster.images.etcd, base_dir)), data, shared
        )
        entry = [r.rank for r in ranks if r.role == "proxy"]
    else:
        raise DatabaseError(f"no cluster layout for database {database!r}")
    cores = bind_lists(node, cluster.workers_per_node, cluster.cores_per_worker) or []
    for spec in ranks:
        spec.node_slot, spec.local_index = divmod(spec.rank, cluster.workers_per_node)
        spec.cores = cores[spec.local_index] if spec.local_index < len(cores) else []
    directory = Path(workdir) / CLUSTER_DIR
    return ClusterLayout(database, cid, directory, data, ranks, entry, shared)


def _abs(path: str, base_dir: Path | None) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() or base_dir is None else (base_dir / p).resolve()


# --- rendering ---------------------------------------------------------------------------------------------


def _ranges(cores: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3,7'."""
    parts: list[str] = []
    for c in sorted(cores):
        if parts and c == int(parts[-1].split("-")[-1]) + 1:
            start = parts[-1].split("-")[0]
            parts[-1] = f"{start}-{c}"
        else:
            parts.append(str(c))
    return ",".join(parts)


def hw_threads(cores: list[int], node: NodeShape) -> list[int]:
    """Physical cores plus their hyper-thread siblings (sibling of core c is c + cores per node)."""
    return sorted(c + t * node.cores for c in cores for t in range(node.threads_per_core))


def launcher_command(layout: ClusterLayout, cluster: DatabaseClusterConfig, node: NodeShape) -> str:
    """The job's command: start every rank on the job's nodes, bound to its cores, then wait."""
    launch = shlex.quote(str(layout.directory / "launch.sh"))
    n, ppn = len(layout.ranks), min(cluster.workers_per_node, len(layout.ranks))
    local = [r for r in layout.ranks if r.node_slot == 0]
    if cluster.launcher == "mpiexec":
        binding = ":".join(_ranges(hw_threads(r.cores, node)) for r in local)
        bind = f" --cpu-bind list:{binding}" if all(r.cores for r in local) else ""
        return f"mpiexec -n {n} --ppn {ppn}{bind} /bin/bash {launch}"
    if cluster.launcher == "srun":
        masks = ",".join(hex(sum(1 << c for c in hw_threads(r.cores, node))) for r in local)
        bind = f" --cpu-bind=mask_cpu:{masks}" if all(r.cores for r in local) else ""
        return f"srun --nodes={cluster.nodes} --ntasks={n} --ntasks-per-node={ppn}{bind} /bin/bash {launch}"
    return f"for r in $(seq 0 {n - 1}); do VDB_RANK=$r /bin/bash {launch} & done; wait"


LIB_SH = r"""# Shared functions of the database ranks (generated by apps/vdb/cluster.py; do not edit).
# A rank: finds its address, waits for rank 0 when it joins one, starts its container, waits until it is
# healthy, records every state in registry/rank-NNN.json, and stops its server when registry/STOP appears.

vdb_addr() {  # IPv4 address of interface $1, else the host's first address
  local a=""
  if [ -n "$1" ]; then
    a=$(ip -o -4 addr show dev "$1" 2>/dev/null | awk '{split($4, p, "/"); print p[1]; exit}')
  fi
  [ -n "$a" ] || a=$(hostname -i 2>/dev/null | awk '{print $1}')
  echo "${a:-127.0.0.1}"
}

vdb_register() {  # state: starting | up | ready | failed | stopped
  local f="$VDB_REGISTRY/rank-$VDB_RANK_ID.json"
  printf '{"rank": %d, "database": "%s", "role": "%s", "host": "%s", "hostname": "%s", ' \
    "$VDB_RANK" "$VDB_DATABASE" "$VDB_ROLE" "$VDB_ADDR" "$(hostname)" > "$f.tmp.$$"
  printf '"ports": %s, "state": "%s", "pid": %s, "log": "%s", "time": %s}\n' \
    "$VDB_PORTS" "$1" "${VDB_PID:-null}" "$VDB_LOG" "$(date +%s)" >> "$f.tmp.$$"
  mv -f "$f.tmp.$$" "$f"  # atomic: readers never see half a file
}

vdb_http_ok() { curl --noproxy '*' -fsS -o /dev/null --max-time 3 "$1" 2>/dev/null; }
vdb_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

vdb_wait_rank0() {  # sets VDB_RANK0_ADDR once rank 0 is up (or ready)
  local f="$VDB_REGISTRY/rank-000.json" deadline=$((SECONDS + VDB_TIMEOUT))
  until [ -f "$f" ] && grep -Eq '"state": "(up|ready)"' "$f"; do
    if [ -f "$VDB_REGISTRY/STOP" ] || [ $SECONDS -ge $deadline ]; then
      echo "rank $VDB_RANK: rank 0 did not come up within ${VDB_TIMEOUT}s" >&2; vdb_register failed; exit 1
    fi
    sleep 2
  done
  VDB_RANK0_ADDR=$(sed -n 's/.*"host": "\([^"]*\)".*/\1/p' "$f")
}

vdb_render() {  # template -> file, with this rank's and rank 0's addresses filled in
  sed -e "s|@VDB_ADDR@|$VDB_ADDR|g" -e "s|@VDB_RANK0_ADDR@|${VDB_RANK0_ADDR:-}|g" "$1" > "$2"
}

vdb_stop() {
  trap - TERM INT
  if [ -n "${VDB_PID:-}" ] && kill -0 "$VDB_PID" 2>/dev/null; then
    kill -TERM "$VDB_PID" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 "$VDB_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL "$VDB_PID" 2>/dev/null
  fi
  vdb_register "${1:-stopped}"
  if [ "$VDB_CLEANUP" = 1 ]; then rm -rf "$VDB_DATA"; fi
  exit "${2:-0}"
}

vdb_serve() {  # start "$@" in the background, wait until healthy, then until STOP or exit
  mkdir -p "$(dirname "$VDB_LOG")"
  "$@" >> "$VDB_LOG" 2>&1 &
  VDB_PID=$!
  trap 'vdb_stop stopped 0' TERM INT
  vdb_register starting
  local deadline=$((SECONDS + VDB_TIMEOUT)) up=0
  until vdb_http_ok "$VDB_READY_URL"; do
    if ! kill -0 "$VDB_PID" 2>/dev/null; then
      echo "rank $VDB_RANK: server exited while starting" >&2; vdb_stop failed 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      echo "rank $VDB_RANK: not healthy after ${VDB_TIMEOUT}s" >&2; vdb_stop failed 1
    fi
    [ -f "$VDB_REGISTRY/STOP" ] && vdb_stop stopped 0
    if [ $up = 0 ] && [ -n "$VDB_UP_PORT" ] && vdb_port_open "$VDB_UP_PORT"; then up=1; vdb_register up; fi
    sleep 1
  done
  vdb_register ready
  while kill -0 "$VDB_PID" 2>/dev/null && [ ! -f "$VDB_REGISTRY/STOP" ]; do sleep 2; done
  if [ -f "$VDB_REGISTRY/STOP" ]; then vdb_stop stopped 0; fi
  echo "rank $VDB_RANK: server exited unexpectedly" >&2
  vdb_stop failed 1
}
"""

DISPATCH_SH = """#!/bin/bash
# Runs the script of this process's rank (PALS/MPICH, Slurm, Open MPI, or VDB_RANK for the local loop).
RANK=${PMI_RANK:-${PALS_RANKID:-${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-${VDB_RANK:-0}}}}}
exec /bin/bash "$(dirname "$0")/ranks/rank-$(printf %03d "$RANK").sh"
"""


def _env_file(spec: RankSpec) -> str:
    """KEY="value" lines for apptainer --env-file, addresses as @placeholders@ filled in at start."""
    lines = []
    for key, value in spec.env.items():
        value = value.replace("${VDB_ADDR}", "@VDB_ADDR@").replace("${VDB_RANK0_ADDR}", "@VDB_RANK0_ADDR@")
        lines.append(f'{key}="{value}"')
    return "\n".join(lines) + "\n"


def _dq(text: str) -> str:
    """Double-quote for bash, keeping ${VDB_...} expansions."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'


def rank_script(layout: ClusterLayout, spec: RankSpec, cluster: DatabaseClusterConfig) -> str:
    """The bash script of one rank: variables, directories, config files, then the container."""
    d = layout.directory
    rank_id = f"{spec.rank:03d}"
    medium_local = cluster.storage.medium in ("memory", "ssd")
    lines = [
        "#!/bin/bash",
        f"# {layout.database} rank {spec.rank} ({spec.role}), node slot {spec.node_slot}, "
        f"cores {_ranges(spec.cores) or 'unbound'} (generated by apps/vdb/cluster.py)",
        "set -u",
        f"source {shlex.quote(str(d / 'lib.sh'))}",
        f"VDB_RANK={spec.rank} VDB_RANK_ID={rank_id} VDB_ROLE={spec.role} VDB_DATABASE={layout.database}",
        f"VDB_REGISTRY={shlex.quote(str(layout.registry))}",
        f"VDB_RANK_DIR={shlex.quote(str(d / 'ranks' / rank_id))}",
        f"VDB_LOG={shlex.quote(str(d / 'logs' / f'rank-{rank_id}.log'))}",
        f"VDB_DATA={_dq(spec.data_dir)}",
        f"VDB_PORTS={shlex.quote(json.dumps(spec.ports))}",
        f"VDB_READY_URL={shlex.quote(spec.ready_url)}",
        f"VDB_UP_PORT={spec.ports[spec.up_port] if spec.up_port else ''}",
        f"VDB_TIMEOUT={int(cluster.startup_timeout_s)}",
        f"VDB_CLEANUP={1 if cluster.storage.cleanup and medium_local else 0}",
        f"VDB_ADDR=$(vdb_addr {shlex.quote(cluster.interface or '')})",
    ]
    if spec.waits_for_rank0:
        lines.append("vdb_wait_rank0")
    mkdirs = [spec.data_dir] + [host for host, _ in spec.binds if not host.startswith("${VDB_RANK_DIR}")]
    dirs = sorted({m for m in mkdirs if not m.endswith((".yaml", ".env"))})
    lines.append("mkdir -p " + " ".join(_dq(m) for m in dirs) + ' "$VDB_RANK_DIR/run"')
    lines.append('vdb_render "$VDB_RANK_DIR/server.env" "$VDB_RANK_DIR/run/server.env"')
    for name in spec.files:
        lines.append(f'vdb_render "$VDB_RANK_DIR/{name}" "$VDB_RANK_DIR/run/{name}"')

    body = " \\\n  ".join(" ".join(_word(a) for a in g) for g in command_groups(spec, cluster))
    lines.append(f"vdb_serve \\\n  {body}")
    return "\n".join(lines) + "\n"


def _word(a: str) -> str:
    return _dq(a) if "$" in a else shlex.quote(a)


def command_groups(spec: RankSpec, cluster: DatabaseClusterConfig) -> list[list[str]]:
    """The rank's container command, one group per option and its value (one line each in scripts)."""
    groups: list[list[str]] = [[cluster.apptainer, "exec", "--cleanenv"]]
    flags = [*spec.apptainer_flags, *cluster.apptainer_args]
    while flags:
        flag = flags.pop(0)
        takes_value = flag in ("--pwd", "--bind", "--env-file", "--home", "--overlay") and flags
        groups.append([flag, flags.pop(0)] if takes_value else [flag])
    for host, target in spec.binds:
        groups.append(["--bind", f"{host.replace('${VDB_RANK_DIR}', '${VDB_RANK_DIR}/run')}:{target}"])
    groups.append(["--env-file", "${VDB_RANK_DIR}/run/server.env"])
    groups.append([spec.image])
    argv = list(spec.argv)
    command = [argv.pop(0)]
    while argv and not argv[0].startswith("-"):
        command.append(argv.pop(0))
    groups.append(command)
    while argv:
        item = [argv.pop(0)]
        if argv and not argv[0].startswith("-") and "=" not in item[0]:
            item.append(argv.pop(0))
        groups.append(item)
    return groups


def server_command(spec: RankSpec, cluster: DatabaseClusterConfig) -> str:
    """The rank's container command on one line (``plan`` output)."""
    return " ".join(_word(a) for g in command_groups(spec, cluster) for a in g)


def describe_ranks(layout: ClusterLayout, cluster: DatabaseClusterConfig) -> str:
    """Every rank of a layout: placement, ports, environment, command and config files, for ``plan``."""
    blocks = []
    for r in layout.ranks:
        head = (
            f"# rank {r.rank} ({r.role}) node slot {r.node_slot} cores {_ranges(r.cores) or '-'} "
            f"ports {json.dumps(r.ports)} data {r.data_dir}"
            + (" (waits for rank 0)" if r.waits_for_rank0 else "")
        )
        parts = [head, _env_file(r).rstrip(), server_command(r, cluster)]
        parts += [f"## {name}\n{text.rstrip()}" for name, text in r.files.items()]
        blocks.append("\n".join(parts))
    return "\n\n".join(blocks) + "\n"


def render_files(layout: ClusterLayout, cluster: DatabaseClusterConfig) -> dict[str, str]:
    """Every file of the deployment, relative to ``layout.directory``."""
    files = {
        "lib.sh": LIB_SH,
        "launch.sh": DISPATCH_SH,
        "layout.json": json.dumps(layout.to_json(), indent=2) + "\n",
    }
    for spec in layout.ranks:
        rank_id = f"{spec.rank:03d}"
        files[f"ranks/rank-{rank_id}.sh"] = rank_script(layout, spec, cluster)
        files[f"ranks/{rank_id}/server.env"] = _env_file(spec)
        for name, text in spec.files.items():
            files[f"ranks/{rank_id}/{name}"] = text
    return files


def write_files(layout: ClusterLayout, cluster: DatabaseClusterConfig) -> None:
    """Write the scripts and an empty registry (a previous attempt's entries would mislead)."""
    for rel, text in render_files(layout, cluster).items():
        path = layout.directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel.endswith(".sh"):
            path.chmod(0o755)
    layout.registry.mkdir(parents=True, exist_ok=True)
    for old in layout.registry.glob("*"):
        old.unlink()
    (layout.directory / "logs").mkdir(exist_ok=True)


# --- the provider of the database job ----------------------------------------------------------------------


def cluster_provider(executor: Any, cluster: DatabaseClusterConfig) -> Any:
    """The Parsl provider that submits the database job (its own nodes, queue and walltime)."""
    from parsl.launchers import SimpleLauncher

    init = list(cluster.worker_init)
    daos = cluster.storage.daos if cluster.storage.medium == "daos" else None
    if daos is not None:
        init += [*daos.setup, daos.mount_command.format(pool=daos.pool, container=daos.container)]
    walltime = cluster.walltime or getattr(executor, "walltime", "01:00:00")
    if executor.platform in ("polaris", "aurora"):
        from parsl.providers import PBSProProvider

        from executors.hpc import pbs_scheduler_options

        filesystems = list(executor.filesystems) + ([daos.filesystem] if daos else [])
        select = cluster.select_options if cluster.select_options is not None else executor.select_options
        return PBSProProvider(
            account=executor.account,
            queue=cluster.queue or executor.queue,
            select_options=select,
            scheduler_options=pbs_scheduler_options(
                filesystems, executor.place, [*executor.scheduler_options, *cluster.scheduler_options]
            ),
            worker_init="\n".join(init),
            nodes_per_block=cluster.nodes,
            cpus_per_node=executor.cpus_per_node,
            init_blocks=0,
            min_blocks=0,
            max_blocks=1,
            walltime=walltime,
            launcher=SimpleLauncher(),  # the command runs mpiexec itself
        )
    if executor.platform == "slurm":
        from parsl.providers import SlurmProvider

        return SlurmProvider(
            partition=cluster.queue or executor.partition,
            account=executor.account,
            qos=executor.qos,
            constraint=executor.constraint,
            nodes_per_block=cluster.nodes,
            gpus_per_node=executor.gpus_per_node if cluster.gpu_indexing else None,
            init_blocks=0,
            min_blocks=0,
            max_blocks=1,
            walltime=walltime,
            scheduler_options="\n".join([*executor.scheduler_options, *cluster.scheduler_options]),
            worker_init="\n".join(init),
            exclusive=executor.exclusive,
            launcher=SimpleLauncher(),
        )
    from parsl.providers import LocalProvider

    return LocalProvider(
        init_blocks=0, min_blocks=0, max_blocks=1, worker_init="\n".join(init), launcher=SimpleLauncher()
    )


def node_shape(executor: Any) -> NodeShape:
    """The executor's node shape (the local platform: this machine, unbound)."""
    return getattr(executor, "node", None) or NodeShape(sockets=1, cores_per_socket=1, gpus=0)


# --- the deployment ----------------------------------------------------------------------------------------


def read_registry(registry: Path) -> dict[int, dict[str, Any]]:
    """rank -> latest entry written by that rank (half-written files never appear: writes are renames)."""
    entries: dict[int, dict[str, Any]] = {}
    for path in sorted(registry.glob("rank-*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        entries[int(entry["rank"])] = entry
    return entries


def endpoints_from_registry(layout: ClusterLayout, entries: dict[int, dict[str, Any]]) -> Endpoints:
    """Endpoints for the clients: the entry ranks, preferred first, with their registered addresses."""
    nodes = []
    by_rank = {r.rank: r for r in layout.ranks}
    for rank in layout.entry_ranks:
        spec, entry = by_rank[rank], entries[rank]
        host, ports = entry["host"], entry["ports"]
        port = int(ports[spec.client_port])
        extra: dict[str, str | int] = {"role": spec.role, "url": f"http://{host}:{port}"}
        if "metrics" in ports:
            extra["metrics_port"] = int(ports["metrics"])
        nodes.append(Endpoint(rank=rank, host=host, port=port, grpc_port=ports.get("grpc"), extra=extra))
    logs = [str(layout.directory / "logs" / f"rank-{r.rank:03d}.log") for r in layout.ranks]
    return Endpoints(
        database=layout.database,
        nodes=nodes,
        data_dir=layout.shared_data or "",
        server_version=f"{layout.database} ({Path(layout.ranks[0].image).name if layout.ranks else '?'})",
        log_paths=logs,
    )


class ClusterDeployment(Deployment):
    """Runs one database as a batch job of Apptainer ranks; ``stop`` ends every rank and the job."""

    def __init__(
        self,
        settings: Any,
        cluster: DatabaseClusterConfig,
        executor: Any,
        base_dir: Path | None = None,
        provider: Any = None,
        poll_s: float = 5.0,
        queue_timeout_s: float | None = None,
    ) -> None:
        # This database's view of the block (its overrides applied).
        self.settings, self.cluster, self.executor = settings, cluster.for_database(settings.name), executor
        self.name = settings.name
        self.base_dir = base_dir
        self.provider = provider
        self.poll_s = poll_s
        self.queue_timeout_s = queue_timeout_s
        self.layout: ClusterLayout | None = None
        self.job_id: str | None = None

    def plan(self, workdir: Path) -> ClusterLayout:
        """The layout this deployment would start under ``workdir`` (no side effects)."""
        return plan_cluster(
            self.settings, self.cluster, node_shape(self.executor), Path(workdir), self.base_dir
        )

    def start(self, workdir: Path, timeout: float = 120.0) -> Endpoints:
        """Submit the job, wait for it to run and for every rank to be healthy; return the endpoints.

        Time in the queue is not counted against ``timeout`` (unless ``queue_timeout_s`` is set).
        """
        workdir = Path(workdir).resolve()
        self.layout = layout = self.plan(workdir)
        write_files(layout, self.cluster)
        provider = self.provider or cluster_provider(self.executor, self.cluster)
        self.provider = provider
        provider.script_dir = str(layout.directory / "jobs")
        Path(provider.script_dir).mkdir(parents=True, exist_ok=True)
        command = launcher_command(layout, self.cluster, node_shape(self.executor))
        self.job_id = provider.submit(command, 1, f"pes2o-vdb.{layout.cluster_id}")
        if not self.job_id:
            raise DatabaseError(f"{self.name}: the scheduler did not accept the database job")
        health_limit = max(timeout, self.cluster.startup_timeout_s)
        queued_since, running_since = time.monotonic(), None
        # The registry is a file read; the scheduler is asked only at its provider's polling interval.
        status_every = float(getattr(provider, "status_polling_interval", 30) or 30)
        status, status_at = None, -float("inf")
        try:
            while True:
                entries = read_registry(layout.registry)
                failed = [e for e in entries.values() if e.get("state") == "failed"]
                if failed:
                    raise DatabaseError(self._failure(f"rank {failed[0]['rank']} failed to start", failed[0]))
                if len(entries) == len(layout.ranks) and all(
                    e.get("state") == "ready" for e in entries.values()
                ):
                    return endpoints_from_registry(layout, entries)
                now = time.monotonic()
                if status is None or now - status_at >= status_every:
                    status, status_at = provider.status([self.job_id])[0], now
                if status.terminal:
                    raise DatabaseError(
                        self._failure(f"database job {self.job_id} ended ({status.state.name})")
                    )
                if running_since is None and (entries or status.state.name == "RUNNING"):
                    running_since = now
                if (
                    running_since is None
                    and self.queue_timeout_s
                    and now - queued_since > self.queue_timeout_s
                ):
                    raise DatabaseError(
                        f"{self.name}: database job still queued after {self.queue_timeout_s:.0f}s"
                    )
                if running_since is not None and now - running_since > health_limit:
                    missing = sorted(
                        set(range(len(layout.ranks)))
                        - {r for r, e in entries.items() if e.get("state") == "ready"}
                    )
                    raise DatabaseError(
                        self._failure(f"ranks {missing} not healthy after {health_limit:.0f}s")
                    )
                time.sleep(self.poll_s)
        except BaseException:
            self.stop()
            raise

    def _failure(self, what: str, entry: dict[str, Any] | None = None) -> str:
        """An error message with the tail of the failing rank's log (or of the job's output)."""
        assert self.layout is not None
        logs = []
        if entry is not None:
            logs.append(
                Path(entry.get("log") or self.layout.directory / "logs" / f"rank-{entry['rank']:03d}.log")
            )
        logs += sorted((self.layout.directory / "jobs").glob("*.std*"))
        shown = "\n".join(f"--- {p}\n{tail(p, 20)}" for p in logs if p.exists())
        return f"{self.name} cluster: {what}\n{shown}".rstrip()

    def stop(self, grace: float = 60.0) -> None:
        """Ask every rank to stop (flushing data), wait up to ``grace`` s, then cancel the job. Idempotent."""
        if self.layout is None or self.job_id is None:
            return
        layout, job_id = self.layout, self.job_id
        self.job_id = None
        (layout.registry / STOP_FILE).touch()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            entries = read_registry(layout.registry)
            if all(e.get("state") in ("stopped", "failed") for e in entries.values()):
                break
            time.sleep(min(self.poll_s, 2.0))
        with contextlib.suppress(Exception):  # the job may be gone already; teardown must not raise
            self.provider.cancel([job_id])


def cluster_deployment(settings: Any, run_config: Any, base_dir: Path | None = None) -> ClusterDeployment:
    """The deployment for ``settings`` when ``run_config.vdb.cluster`` is set (call from the benchmark)."""
    return ClusterDeployment(settings, run_config.vdb.cluster, run_config.executor, base_dir)
