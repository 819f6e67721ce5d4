"""Qdrant's own config checks on HPC (no client library: validating a config imports none)."""

from __future__ import annotations

from typing import Any

from apps.vdb.cluster.checks import ClusterCheck, Problem, needs_mmap, shards_per_worker


def settings_problems(settings: Any, index: int, shards: int) -> list[Problem]:
    """With ``vdb.cluster`` the pilot starts the servers: no embedded engine, no external server.

    ``shards`` (``vdb.collection.shards``) is checked against the layout in :func:`cluster_problems`.
    """
    if settings.mode != "server" or settings.url:
        return [(("vdb", "databases", index, "mode"), "with vdb.cluster, qdrant needs mode: server, no url")]
    return []


def cluster_problems(check: ClusterCheck) -> list[Problem]:
    """DAOS (mmap), the GPU build's vendors, and one shard set per worker."""
    problems = needs_mmap(check)
    if check.cluster.gpu_indexing and check.platform == "aurora":
        problems.append((check.at("gpu_indexing"), "Qdrant's GPU build supports NVIDIA/AMD, not Intel GPUs"))
    return problems + shards_per_worker(check)
