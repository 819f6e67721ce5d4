"""pgvector's own config checks on HPC (no client library: validating a config imports none)."""

from __future__ import annotations

from typing import Any

from apps.vdb.cluster.checks import ClusterCheck, Problem, no_gpu_indexing


def settings_problems(settings: Any, index: int, shards: int) -> list[Problem]:
    """With ``vdb.cluster`` the pilot starts the server: no ``url``, and TCP (clients run on other nodes)."""
    problems: list[Problem] = []
    if settings.url:
        problems.append((("vdb", "databases", index, "url"), "with vdb.cluster, pgvector must not set url"))
    if settings.unix_socket:
        problems.append(
            (
                ("vdb", "databases", index, "unix_socket"),
                "with vdb.cluster, clients run on other nodes: pgvector listens on TCP (unix_socket: false)",
            )
        )
    return problems


def cluster_problems(check: ClusterCheck) -> list[Problem]:
    """One server process (PostgreSQL does not shard a table over servers here), no GPU build."""
    problems: list[Problem] = []
    if check.cluster.workers != 1:
        problems.append((check.at("workers"), "pgvector runs one PostgreSQL server: set workers: 1"))
    return problems + no_gpu_indexing(check)
