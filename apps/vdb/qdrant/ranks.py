"""Qdrant peers on an HPC pilot job: rank 0 starts with its p2p URI, the others bootstrap from it.

Every peer requires an API key on its REST and gRPC ports: its start script (:func:`apps.vdb.secret.
start_script`, bound into the container with the rank's run directory) makes a random key once in that
directory (0600) and exports it as ``QDRANT__SERVICE__API_KEY`` before it execs the server; the clients
read the file of the peer they talk to (``client_files``). Each peer has its own key: clients only ever
send a request to one peer, and peers talk to each other over the p2p port, which the key does not guard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apps.vdb.cluster.config import DatabaseClusterConfig
from apps.vdb.cluster.layout import rank_ports
from apps.vdb.cluster.spec import RankPlan, RankSpec
from apps.vdb.qdrant.env import API_KEY_FILE, API_KEY_VAR, server_env
from apps.vdb.secret import start_script

RUN = "/opt/pes2o/run"  # the rank's run directory (start script, API key) inside the container
START = "start-qdrant.sh"


def image_field(cluster: DatabaseClusterConfig, settings: Any = None) -> str:
    """The ``vdb.cluster.images`` field Qdrant runs from: the GPU image when it indexes on GPUs."""
    return "qdrant_gpu" if cluster.gpu_indexing else "qdrant"


def plan_ranks(
    settings: Any, cluster: DatabaseClusterConfig, image: str, data: str, base_dir: Path | None
) -> RankPlan:
    """One peer per worker; clients may connect to any of them.

    ``QDRANT__SERVICE__HOST`` places REST, gRPC and the p2p port: the rank's interface address only, so
    readiness is probed there as well.
    """
    ranks = []
    p2p0 = rank_ports(cluster, 0, ["http", "grpc", "p2p"])["p2p"]
    for r in range(cluster.workers):
        ports = rank_ports(cluster, r, ["http", "grpc", "p2p"])
        rank_dir = f"{data}/rank-{r:03d}"
        env = server_env(
            "${VDB_ADDR}",
            ports["http"],
            ports["grpc"],
            "/qdrant/storage",
            "/qdrant/snapshots",
            p2p_port=ports["p2p"],
            gpu_indexing=cluster.gpu_indexing,
        )
        argv = [
            "/bin/sh",
            f"{RUN}/{START}",
            RUN,
            "/qdrant/qdrant",
            "--uri",
            f"http://${{VDB_ADDR}}:{ports['p2p']}",
        ]
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
                    ("${VDB_RANK_DIR}", RUN),  # its run directory: start script and API key
                ],
                data_dir=rank_dir,
                ready_url=f"http://${{VDB_ADDR}}:{ports['http']}/readyz",
                waits_for_rank0=r > 0,
                apptainer_flags=flags,
                files={START: start_script("qdrant", API_KEY_VAR, API_KEY_FILE)},
                client_files={"api_key_file": f"run/{API_KEY_FILE}"},
            )
        )
    return RankPlan(ranks, list(range(len(ranks))))
