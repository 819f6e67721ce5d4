"""Qdrant's own config checks on HPC (no client library: validating a config imports none)."""

from __future__ import annotations

from typing import Any

from apps.vdb.cluster.checks import ClusterCheck, Problem, needs_mmap, shards_per_worker


def settings_problems(settings: Any, index: int, shards: int) -> list[Problem]:
    """With ``vdb.cluster`` the pilot starts the servers (no external server), or ``mode: edge`` runs the
    engine inside the clients on the client block (no pilot job). ``shards`` is checked against the layout
    in :func:`cluster_problems`."""
    if settings.mode == "server" and (settings.url or settings.local_path):
        return [
            (
                ("vdb", "databases", index, "url" if settings.url else "local_path"),
                "with vdb.cluster, qdrant runs as a pilot (mode: server, no url or local_path) or "
                "inside its clients (mode: edge)",
            )
        ]
    return []


def cluster_problems(check: ClusterCheck) -> list[Problem]:
    """DAOS (mmap), the GPU build's vendors, and one shard set per worker."""
    problems = needs_mmap(check)
    if check.cluster.gpu_indexing and check.platform == "aurora":
        problems.append((check.at("gpu_indexing"), "Qdrant's GPU build supports NVIDIA/AMD, not Intel GPUs"))
    return problems + shards_per_worker(check)
