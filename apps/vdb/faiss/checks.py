"""FAISS's config checks on HPC (no client library). It has no server: it runs inside its clients."""

from __future__ import annotations

from typing import Any

from apps.vdb.cluster.checks import ClusterCheck, Problem


def settings_problems(settings: Any, index: int, shards: int) -> list[Problem]:
    """None: with ``vdb.cluster`` FAISS still runs on the client block (it is never a pilot job), as one
    index (the vdb stages give an in-process engine ``shards: 1`` there, like Qdrant edge)."""
    return []


def cluster_problems(check: ClusterCheck) -> list[Problem]:
    """None: FAISS never runs as a pilot (``VdbConfig.pilot_databases`` leaves in-process engines out)."""
    return []
