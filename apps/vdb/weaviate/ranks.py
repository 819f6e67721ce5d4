"""Weaviate nodes on an HPC pilot job: one node name and port set per rank, gossip join to rank 0, raft join
list of every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apps.vdb.cluster.config import DatabaseClusterConfig
from apps.vdb.cluster.layout import common_env, rank_ports
from apps.vdb.cluster.spec import RankPlan, RankSpec
from apps.vdb.weaviate.env import server_env

SCHEME = ["--scheme", "http"]


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
                bind="${VDB_ADDR}",  # gossip, raft, gRPC and cluster data on the configured interface only
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
                argv=["/bin/weaviate", "--host", "${VDB_ADDR}", "--port", str(ports["http"]), *SCHEME],
                env=env,
                binds=[(rank_dir, "/var/lib/weaviate")],
                data_dir=rank_dir,
                # REST listens on the interface only, so readiness is probed there too
                ready_url=f"http://${{VDB_ADDR}}:{ports['http']}/v1/.well-known/ready",
                up_port="gossip",  # joiners exit when rank 0's gossip port is not listening yet
                waits_for_rank0=r > 0,
            )
        )
    return RankPlan(ranks, list(range(len(ranks))))
