"""Weaviate nodes on an HPC pilot job: one node name and port set per rank, gossip join to rank 0, raft join
list of every rank.

Every node requires an API key (:mod:`apps.vdb.weaviate.env`): its start script
(:func:`apps.vdb.secret.start_script`, in the rank's run directory, bound into the container) makes a random
key once in that directory (0600) and exports it before it execs the server, so the key is in no rendered
file; the clients read the file of each node they talk to (``client_files``). Each node has its own key:
a client sends a request to one node with that node's key, and the nodes talk to each other over gossip,
raft and the cluster API, which the key does not guard. Under runtime native the script runs on the host
with the configured executable, so this module lays those ranks out itself (``RankPlan.native``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apps.vdb.base import DatabaseError
from apps.vdb.cluster.config import DatabaseClusterConfig
from apps.vdb.cluster.layout import common_env, rank_ports
from apps.vdb.cluster.spec import RankPlan, RankSpec
from apps.vdb.secret import start_script
from apps.vdb.weaviate.env import API_KEY_FILE, API_KEY_VAR, server_env

SCHEME = ["--scheme", "http"]
RUN = "/opt/pes2o/run"  # the rank's run directory (start script, API key) inside the container
START = "start-weaviate.sh"
DATA = "/var/lib/weaviate"  # the rank's data directory inside the container


def image_field(cluster: DatabaseClusterConfig, settings: Any = None) -> str:
    """The ``vdb.cluster.images`` field Weaviate runs from."""
    return "weaviate"


def plan_ranks(
    settings: Any, cluster: DatabaseClusterConfig, image: str, data: str, base_dir: Path | None
) -> RankPlan:
    """One node per worker; clients may connect to any of them.

    Every listener is on the rank's interface address (``${VDB_ADDR}``): REST through ``--host``, the
    others through the bind variables of :func:`apps.vdb.weaviate.env.server_env`. gRPC and the cluster
    data port follow theirs only in a server built with scripts/weaviate/listen-host.patch; the vendor's
    image listens there on every interface (see :mod:`apps.vdb.weaviate.deploy`, docs/reliability.md).
    """
    native = cluster.runtime == "native"
    if native and not image:
        raise DatabaseError("vdb.cluster.executables.weaviate: runtime native needs the server executable")
    names = ["http", "grpc", "gossip", "data", "raft", "raft_rpc"]
    all_ports = [rank_ports(cluster, r, names) for r in range(cluster.workers)]
    # Per-node raft ports (several ranks per node) need Weaviate's node->port map, which it builds from
    # RAFT_JOIN only in CLUSTER_IN_LOCALHOST mode; addresses still come from gossip (CLUSTER_ADVERTISE_ADDR).
    raft_join = ",".join(f"node{r}:{p['raft']}" for r, p in enumerate(all_ports))
    ranks = []
    for r, ports in enumerate(all_ports):
        rank_dir = f"{data}/rank-{r:03d}"
        # Native: host paths where the container has its mounts (what apps.vdb.cluster.native renames).
        run, home = ("${VDB_RANK_DIR}/run", rank_dir) if native else (RUN, DATA)
        env = {
            **common_env(cluster),
            **server_env(
                settings,
                node=f"node{r}",
                data_path=home,
                advertise="${VDB_ADDR}",
                ports=ports,
                raft_join=raft_join,
                expect=cluster.workers,
                bind="${VDB_ADDR}",  # gossip, raft, gRPC and cluster data on the configured interface only
            ),
            **settings.env,
        }
        if r > 0:
            env["CLUSTER_JOIN"] = f"${{VDB_RANK0_ADDR}}:{all_ports[0]['gossip']}"
        server = [image if native else "/bin/weaviate", "--host", "${VDB_ADDR}", "--port", str(ports["http"])]
        # the container's own run directory mount; natively the script finds the host's directly
        binds = [] if native else [(rank_dir, DATA), ("${VDB_RANK_DIR}", RUN)]
        ranks.append(
            RankSpec(
                rank=r,
                role="node",
                ports=ports,
                client_port="http",
                image=image,
                argv=["/bin/sh", f"{run}/{START}", run, *server, *SCHEME],
                env=env,
                binds=binds,
                data_dir=rank_dir,
                # REST listens on the interface only, so readiness is probed there too
                ready_url=f"http://${{VDB_ADDR}}:{ports['http']}/v1/.well-known/ready",
                up_port="gossip",  # joiners exit when rank 0's gossip port is not listening yet
                waits_for_rank0=r > 0,
                files={START: start_script("weaviate", API_KEY_VAR, API_KEY_FILE)},
                client_files={"api_key_file": f"run/{API_KEY_FILE}"},
            )
        )
    return RankPlan(ranks, list(range(len(ranks))), native=native)
