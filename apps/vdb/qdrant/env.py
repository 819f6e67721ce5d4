"""Qdrant's server environment, written once: the local binary and the HPC peers both start from it.

A server requires its deployment's API key (:data:`API_KEY_VAR`, set by the caller: the local deployment
puts it in the process's environment, an HPC peer's start script exports it from its file), so it is never
in this environment, which HPC ranks write to their env files. The in-process engine (``mode: edge``) has
no network listener, so no key applies there.
"""

from __future__ import annotations

API_KEY_VAR = "QDRANT__SERVICE__API_KEY"  # REST and gRPC refuse requests without it (not /readyz)
API_KEY_FILE = "api-key"  # the key's file in the deployment's (an HPC rank's: run) directory


def server_env(
    host: str,
    http_port: int,
    grpc_port: int,
    storage: str,
    snapshots: str,
    *,
    p2p_port: int | None = None,
    gpu_indexing: bool = False,
) -> dict[str, str]:
    """``QDRANT__*`` variables of one server; ``p2p_port`` turns on cluster mode (HPC peers)."""
    env = {
        "QDRANT__SERVICE__HOST": host,
        "QDRANT__SERVICE__HTTP_PORT": str(http_port),
        "QDRANT__SERVICE__GRPC_PORT": str(grpc_port),
    }
    if p2p_port is not None:
        env["QDRANT__CLUSTER__ENABLED"] = "true"
        env["QDRANT__CLUSTER__P2P__PORT"] = str(p2p_port)
    env["QDRANT__STORAGE__STORAGE_PATH"] = storage
    env["QDRANT__STORAGE__SNAPSHOTS_PATH"] = snapshots
    env["QDRANT__TELEMETRY_DISABLED"] = "true"
    if gpu_indexing:
        env["QDRANT__GPU__INDEXING"] = "true"
    return env
