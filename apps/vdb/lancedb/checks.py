"""LanceDB's config checks on HPC (no client library: validating a config imports none).

LanceDB has no server: with ``vdb.cluster`` it is not a pilot job but runs inside its clients on the
client block, like Qdrant edge, so there is no layout to check (no ``cluster_problems``).
"""

from __future__ import annotations

from typing import Any

from apps.vdb.cluster.checks import Problem


def settings_problems(settings: Any, index: int, shards: int) -> list[Problem]:
    """A relative ``data_path`` would resolve against whatever directory a client task starts in."""
    if settings.data_path and not settings.data_path.startswith(("/", "~")):
        return [
            (
                ("vdb", "databases", index, "data_path"),
                "with vdb.cluster, lancedb's data_path must be absolute (clients run on other nodes)",
            )
        ]
    return []
