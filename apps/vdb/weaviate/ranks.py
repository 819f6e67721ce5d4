"""Weaviate nodes on an HPC pilot job: one node name and port set per rank, gossip join to rank 0, raft join
list of every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apps.vdb.cluster.config import DatabaseClusterConfig
from apps.vdb.cluster.layout import RankPlan, RankSpec, common_env, rank_ports
from apps.vdb.weaviate.env import server_env


def image_field(cluster: DatabaseClusterConfig) -> str:
    """The ``vdb.cluster.images`` field Weaviate runs from."""
    return "weaviate"


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
            **server_env(
                settings,
                node=f"node{r}",
                data_path="/var/lib/weaviate",
                advertise="${VDB_ADDR}",
                ports=ports,
                raft_join=raft_join,
                expect=cluster.workers,
            ),
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
