"""What a database's own cluster checks receive, and the rules several databases share.

``pipeline/config/checks.py`` runs the checks every cluster needs (fit, ports, cores, image, storage) and then
asks each database for its own (the ``cluster_checks`` of its declaration, through :mod:`apps.vdb`),
passing a :class:`ClusterCheck`. Problems are ``(field path, message)`` pairs, field paths as the user wrote
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from apps.vdb.cluster.config import DatabaseClusterConfig
from apps.vdb.cluster.layout import absolute

Problem = tuple[tuple, str]


@dataclass(frozen=True)
class ClusterCheck:
    """One database's cluster as the checks see it."""

    name: str
    block: DatabaseClusterConfig  # vdb.cluster as written
    cluster: DatabaseClusterConfig  # with this database's overrides applied
    platform: str
    media: tuple[str, ...]  # storage media the platform offers
    collection_shards: int  # vdb.collection.shards
    base_dir: Path | None  # resolves relative paths (the config file's directory)
    # False: its workers do not fit its nodes, which the shared checks refuse (so no rule rests on them)
    workers_fit: bool = True

    def at(self, *fields: str) -> tuple:
        """Path of a cluster field as the user wrote it (under overrides.<name> when overridden there)."""
        return self.block.field_path(self.name, fields[0]) + tuple(fields[1:])

    def exists(self, path: str) -> bool:
        """True when ``path`` (relative to the config file) is a file."""
        return absolute(path, self.base_dir).is_file()


# ALCF: "Applications which require mmap ... should use launch-dfuse-with-caching.sh" (argonne-lcf/
# user-guides docs/aurora/data-management/daos/daos-overview.md); the study, on plain dfuse, found the mmap
# calls of Qdrant and Weaviate unsupported and left them out of its DAOS runs (../shared/papers/000 §V).
CACHING_DFUSE = "launch-dfuse-with-caching.sh"


def needs_mmap(check: ClusterCheck) -> list[Problem]:
    """Databases that mmap their files need DAOS mounted with dfuse's caching (ALCF's mmap mount)."""
    storage = check.cluster.storage
    if storage.medium != "daos" or "daos" not in check.media:
        return []
    if storage.daos is not None and CACHING_DFUSE in storage.daos.mount_command:
        return []
    return [(
        check.at("storage", "medium"),
        f"{check.name} mmaps its files, which dfuse serves only when mounted with caching: set "
        f"vdb.cluster.storage.daos.mount_command to '{CACHING_DFUSE} {{pool}}:{{container}}' (ALCF's mount "
        "for mmap; the study left it out of its DAOS runs)",
    )]  # fmt: skip


def no_gpu_indexing(check: ClusterCheck) -> list[Problem]:
    """The block-wide ``gpu_indexing`` flag does not concern this database; an override asks explicitly."""
    if check.cluster.gpu_indexing and check.at("gpu_indexing")[2] == "overrides":
        return [(check.at("gpu_indexing"), f"only Qdrant indexes on GPUs here, not {check.name}")]
    return []


def shards_per_worker(check: ClusterCheck) -> list[Problem]:
    """The collection's shards must be workers x shards_per_worker (each worker holds its own). Not
    asked of workers that do not fit their nodes: the shards they would need is no advice."""
    c = check.cluster
    if not check.workers_fit:
        return []
    shards = c.workers * c.shards_per_worker
    if check.collection_shards != shards:
        message = (
            f"{check.name}: {c.workers} workers x {c.shards_per_worker} shard(s) each: set shards: {shards}"
        )
        return [(("vdb", "collection", "shards"), message)]
    return []
