"""Weaviate nodes on an HPC pilot job: one node name and port set per rank, gossip join to rank 0, raft join
list of every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apps.vdb.cluster.config import DatabaseClusterConfig
from apps.vdb.cluster.layout import RankPlan, RankSpec, common_env, rank_ports


def plan_ranks(
    settings: Any, cluster: DatabaseClusterConfig, image: str, data: str, base_dir: Path | None
) -> RankPlan:
    """One node per worker; clients may connect to any of them."""
    names = ["http", "grpc", "gossip", "data", "raft", "raft_rpc"]
    all_ports = [rank_ports(cluster, r, names) for r in range(cluster.workers)]
    # Per-node raft ports (several ranks per node) need Weaviate's node->port map, which it builds from
    # RAFT_JOIN only in CLUSTER_IN_LOCALHOST mode; addresses still come from gossip (CLUSTER_ADVERTISE_ADDR).
    raft_join = ",".join(f"node{r}:{p['raft']}" for r, p in enumerate(all_ports))
    ranks = []
    for r, ports in enumerate(all_ports):
        env = {
            **common_env(cluster),
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
    return RankPlan(ranks, list(range(len(ranks))))
