"""Weaviate's own config checks on HPC (no client library: validating a config imports none)."""

from __future__ import annotations

from typing import Any

from apps.vdb.cluster.checks import ClusterCheck, Problem, needs_mmap, no_gpu_indexing, shards_per_worker


def settings_problems(settings: Any, index: int, shards: int) -> list[Problem]:
    """With ``vdb.cluster`` the pilot starts the nodes: no external server.

    ``shards`` (``vdb.collection.shards``) is checked against the layout in :func:`cluster_problems`.
    """
    if settings.url:
        return [(("vdb", "databases", index, "url"), "with vdb.cluster, weaviate must not set url")]
    if settings.nodes != 1:  # a local cluster's process count: ignored by the pilot, the points all alike
        return [
            (
                ("vdb", "databases", index, "nodes"),
                f"with vdb.cluster, nodes: {settings.nodes} (a local cluster's process count) does not "
                "apply: the pilot's ranks are the deployment; set the entry's cluster.workers and "
                "cluster.nodes, or sweep them",
            )
        ]
    return []


def cluster_problems(check: ClusterCheck) -> list[Problem]:
    """DAOS (mmap), no GPU build, and one shard set per worker."""
    return needs_mmap(check) + no_gpu_indexing(check) + shards_per_worker(check)
