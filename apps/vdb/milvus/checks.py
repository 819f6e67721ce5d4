"""Milvus's own config checks on HPC (no client library: validating a config imports none)."""

from __future__ import annotations

from typing import Any

from apps.vdb.cluster.checks import ClusterCheck, Problem, no_gpu_indexing


def settings_problems(settings: Any, index: int) -> list[Problem]:
    """With ``vdb.cluster`` the pilot starts the servers: no external server."""
    if settings.uri:
        return [(("vdb", "databases", index, "uri"), "with vdb.cluster, milvus must not set uri")]
    return []


def cluster_problems(check: ClusterCheck) -> list[Problem]:
    """The layout's process count, the etcd image, a shared directory across nodes, no GPU build."""
    c, at = check.cluster, check.at
    m, problems = c.milvus, []
    if m.mode == "distributed" and c.workers != m.ranks:
        problems.append(
            (
                at("workers"),
                f"milvus distributed runs {m.ranks} processes (etcd, mixcoord, {m.proxies} proxy, "
                f"{m.streaming_nodes} streaming, {m.query_nodes} query, {m.data_nodes} data): "
                f"set workers: {m.ranks}",
            )
        )
    if m.mode == "standalone" and c.workers != 1:
        problems.append((at("workers"), "milvus standalone is one process: set workers: 1"))
    if m.mode == "distributed":
        etcd = c.images.get("etcd")
        if not etcd:
            problems.append((("vdb", "cluster", "images", "etcd"), "milvus distributed needs an etcd image"))
        elif not check.exists(etcd):
            problems.append((("vdb", "cluster", "images", "etcd"), f"image {etcd} does not exist"))
        if c.nodes > 1 and not c.storage.shared:
            problems.append(
                (
                    at("storage", "medium"),
                    "milvus distributed over several nodes needs lustre or daos (shared)",
                )
            )
    return problems + no_gpu_indexing(check)
