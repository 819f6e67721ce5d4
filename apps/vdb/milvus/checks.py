"""Milvus's own config checks on HPC (no client library: validating a config imports none)."""

from __future__ import annotations

from typing import Any

from apps.vdb.cluster.checks import ClusterCheck, Problem, no_gpu_indexing

# proxy.maxShardNum of milvus.yaml in 2.3 and 2.6: a collection with more shards is refused at creation.
MAX_SHARDS_KEY, DEFAULT_MAX_SHARDS = "proxy.maxShardNum", 16


def settings_problems(settings: Any, index: int, shards: int) -> list[Problem]:
    """With ``vdb.cluster`` the pilot starts the servers: no external server; Milvus must accept ``shards``.

    ``shards`` is ``vdb.collection.shards``; Milvus refuses a collection with more than ``proxy.maxShardNum``
    (16 unless ``config_overrides`` raises it), which would otherwise fail only once the cluster is up.
    """
    problems: list[Problem] = []
    if settings.uri:
        problems.append((("vdb", "databases", index, "uri"), "with vdb.cluster, milvus must not set uri"))
    override = settings.config_overrides.get(MAX_SHARDS_KEY)
    where = ("vdb", "databases", index, "config_overrides", MAX_SHARDS_KEY)
    if override is None:
        limit = DEFAULT_MAX_SHARDS
    elif isinstance(override, bool) or not str(override).strip().isdigit():
        return [*problems, (where, f"{MAX_SHARDS_KEY} must be a whole number, not {override!r}")]
    else:
        limit = int(str(override).strip())
    if shards > limit:
        fix = f"set config_overrides: {{{MAX_SHARDS_KEY}: {shards}}} for milvus or use fewer shards"
        if override is None:
            message = f"milvus accepts at most {limit} shards ({MAX_SHARDS_KEY}, its default): {fix}"
            problems.append((("vdb", "collection", "shards"), f"{shards} shards: {message}"))
        else:
            problems.append((where, f"{limit} is below vdb.collection.shards ({shards}): {fix}"))
    return problems


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
