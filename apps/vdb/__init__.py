"""Vector databases: one folder per database, found through this registry.

Each folder ``apps/vdb/<name>/`` holds everything about that database:

* ``settings.py``: its config model (pydantic only), exported as ``SETTINGS``; ``PACKAGES``, the client
  packages whose versions the provenance records; ``INDEX_TYPES``, the index types it builds;
  ``with_threads(settings, n)``, its settings with its own thread knobs set for n cores;
* ``adapter.py``: ``ADAPTER``, built from its local deployment (``deploy.py``) and client (``client.py``);
* ``env.py``: its server environment, used by both the local deployment and the HPC ranks;
* ``ranks.py``: its ranks on an HPC pilot job (``plan_ranks``) and its image field (``image_field``);
* ``checks.py``: its own config checks on HPC (``settings_problems``, ``cluster_problems``).

A library that only ever runs inside its clients (no server, no pilot job) sets ``IN_PROCESS_ONLY = True``
in its settings module and has no ``env.py`` or ``ranks.py``.

Modules are imported lazily, so validating a config imports no client library (settings, ranks and checks
import none) and a worker imports only the database it talks to. Adding a database means adding a folder
and one line to ``DATABASES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DATABASES = {
    "weaviate": "apps.vdb.weaviate",
    "milvus": "apps.vdb.milvus",
    "qdrant": "apps.vdb.qdrant",
    "pgvector": "apps.vdb.pgvector",
    "lancedb": "apps.vdb.lancedb",
    "faiss": "apps.vdb.faiss",
}


@dataclass(frozen=True)
class Adapter:
    """What an adapter module provides: its settings model and the two halves of the interface.

    ``deployment(settings)`` returns a ``Deployment``; ``client(settings, endpoints, client_index=0)`` returns
    a ``Client`` connected to ``endpoints.entry(client_index)``.
    """

    name: str
    settings: type
    deployment: Any
    client: Any


def _part(name: str, part: str) -> Any:
    try:
        package = DATABASES[name]
    except KeyError:
        raise ValueError(f"unknown database {name!r}; known: {', '.join(sorted(DATABASES))}") from None
    return importlib.import_module(f"{package}.{part}")


def get_adapter(name: str) -> Adapter:
    """The adapter registered under ``name`` (ValueError naming the known ones otherwise)."""
    return _part(name, "adapter").ADAPTER


def settings_models() -> list[type]:
    """Every database's settings model (pydantic only), in registry order."""
    return [_part(name, "settings").SETTINGS for name in DATABASES]


def supported_index_types(name: str) -> tuple[str, ...]:
    """The ``vdb.collection.index_type`` values database ``name`` builds (``INDEX_TYPES`` of its settings)."""
    return tuple(_part(name, "settings").INDEX_TYPES)


def thread_setter(name: str) -> Callable[[Any, int], Any]:
    """``with_threads(settings, n)`` of database ``name``: its settings with its thread knobs set for n cores
    (values the user set win). A database without thread knobs of its own keeps its settings: only the
    CPU affinity applies to it."""
    return getattr(_part(name, "settings"), "with_threads", lambda settings, _cores: settings)


def client_packages() -> list[str]:
    """Every database's client packages (``PACKAGES`` of its settings module), in registry order."""
    return [package for name in DATABASES for package in _part(name, "settings").PACKAGES]


def cluster_ranks(name: str) -> Callable[..., Any]:
    """``plan_ranks(settings, cluster, image, data, base_dir) -> RankPlan`` of database ``name``."""
    return _part(name, "ranks").plan_ranks


def cluster_image_field(name: str, cluster: Any, settings: Any = None) -> str:
    """The ``vdb.cluster.images`` field database ``name`` runs from on this cluster block (a ranks module
    whose image depends on its settings too, pgvector's VectorChord, also has ``image_field_for``)."""
    ranks = _part(name, "ranks")
    if settings is not None and hasattr(ranks, "image_field_for"):
        return ranks.image_field_for(cluster, settings)
    return ranks.image_field(cluster)


def cluster_checks(name: str) -> Any:
    """Database ``name``'s checks: ``settings_problems(settings, index, shards)`` (``shards`` is
    ``vdb.collection.shards``) and ``cluster_problems(check)``."""
    return _part(name, "checks")


def image_names() -> dict[str, str]:
    """Every database's Apptainer image names (``vdb.cluster.images`` keys) with what each holds."""
    return {name: text for db in DATABASES for name, text in _part(db, "settings").IMAGES.items()}
