"""Vector-database adapters. Each module ``apps/vdb/<name>.py`` exposes ``ADAPTER``.

The registry maps a database name to its module lazily, so importing the registry does not
import every client library (weaviate-client, pymilvus, qdrant) into every worker.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

ADAPTER_MODULES = {
    "weaviate": "apps.vdb.weaviate",
    "milvus": "apps.vdb.milvus",
    "qdrant": "apps.vdb.qdrant",
}


@dataclass(frozen=True)
class Adapter:
    """What an adapter module provides: its settings model and the two halves of the interface.

    ``deployment(settings)`` returns a ``Deployment``; ``client(settings, endpoints)`` returns a ``Client``.
    """

    name: str
    settings: type
    deployment: Any
    client: Any


def get_adapter(name: str) -> Adapter:
    """The adapter registered under ``name`` (ValueError naming the known ones otherwise)."""
    try:
        module_name = ADAPTER_MODULES[name]
    except KeyError:
        raise ValueError(f"unknown database {name!r}; known: {', '.join(sorted(ADAPTER_MODULES))}") from None
    return importlib.import_module(module_name).ADAPTER
