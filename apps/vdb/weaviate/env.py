"""Weaviate's server environment, written once: the local nodes and the HPC ranks both start from it.

Every node requires an API key on REST and gRPC (anonymous access off); the key itself (:data:`API_KEY_VAR`)
is set by the caller, never here, because HPC ranks write this environment to their env files: the local
deployment puts it in the processes' environment, an HPC rank's start script exports it from its file.
Without an authorization module every authenticated user may read and write, which the clients need.
"""

from __future__ import annotations

from typing import Any

API_KEY_VAR = "AUTHENTICATION_APIKEY_ALLOWED_KEYS"  # the one key every node accepts
API_KEY_USER = "pes2o-vdb"  # the user that key authenticates as (AUTHENTICATION_APIKEY_USERS)
API_KEY_FILE = "api-key"  # the key's file in the deployment's (an HPC rank's: run) directory


def server_env(
    settings: Any,
    *,
    node: str,
    data_path: str,
    advertise: str,
    ports: dict[str, int],
    raft_join: str,
    expect: int,
    bind: str | None = None,
) -> dict[str, str]:
    """The variables of one node (``ports``: gossip, data, raft, raft_rpc, grpc).

    ``CLUSTER_IN_LOCALHOST`` lets several nodes share a host with their own raft ports: Weaviate then
    reads the node -> raft port map from ``RAFT_JOIN`` (``node:port``) and expects each node's internal
    RPC at the port given here. ``bind`` pins every listener but REST (``--host``) to one address
    (loopback locally, the interface on HPC): gossip, raft and raft RPC through ``CLUSTER_BIND_ADDR``, the
    gRPC and cluster data ports through ``GRPC_BIND_HOST`` and ``CLUSTER_DATA_BIND_HOST``, which only our
    patched build reads (scripts/weaviate/listen-host.patch; see :mod:`apps.vdb.weaviate.deploy`).
    """
    env = {
        "AUTHENTICATION_ANONYMOUS_ACCESS_ENABLED": "false",
        "AUTHENTICATION_APIKEY_ENABLED": "true",
        "AUTHENTICATION_APIKEY_USERS": API_KEY_USER,
        "PERSISTENCE_DATA_PATH": data_path,
        "DEFAULT_VECTORIZER_MODULE": "none",
        "CLUSTER_HOSTNAME": node,
        "CLUSTER_ADVERTISE_ADDR": advertise,
    }
    if bind is not None:
        env["CLUSTER_BIND_ADDR"] = bind
        env["GRPC_BIND_HOST"] = bind
        env["CLUSTER_DATA_BIND_HOST"] = bind
    env.update(
        {
            "CLUSTER_GOSSIP_BIND_PORT": str(ports["gossip"]),
            "CLUSTER_DATA_BIND_PORT": str(ports["data"]),
            "CLUSTER_IN_LOCALHOST": "true",
            "RAFT_PORT": str(ports["raft"]),
            "RAFT_INTERNAL_RPC_PORT": str(ports["raft_rpc"]),
            "RAFT_JOIN": raft_join,
            "RAFT_BOOTSTRAP_EXPECT": str(expect),
            "RAFT_TIMEOUTS_MULTIPLIER": str(settings.raft_timeouts_multiplier),
            "GRPC_PORT": str(ports["grpc"]),
            "ASYNC_INDEXING": str(settings.async_indexing).lower(),
            "DISABLE_TELEMETRY": "true",
            "GO_PROFILING_DISABLE": "true",  # otherwise every node binds :6060
        }
    )
    return env
