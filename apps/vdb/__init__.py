"""Vector databases: one folder per database, found through this registry.

Each folder ``apps/vdb/<name>/`` holds everything about that database, and its ``__init__.py`` declares it:
``DATABASE = Database(...)`` (:class:`apps.vdb.declaration.Database`): its settings model (``settings.py``,
pydantic only), client packages, index types and what it builds with them, images, whether it runs in
process, and the import paths of its deployment (``deploy.py``), client (``client.py``), HPC ranks
(``ranks.py``, with ``env.py``, its server environment) and config checks on HPC (``checks.py``).
A library that only ever runs inside its clients (``in_process=True``) has no ``env.py`` or ``ranks.py``.

Declarations import only their settings module, so validating a config imports no client library and a
worker imports only the database it talks to. Adding a database means adding a folder, one line to
``DATABASES`` and one test file.
"""

from __future__ import annotations

import importlib
from typing import Any

from apps.vdb.declaration import Database

# name -> the package whose ``DATABASE`` declares it (imported on first use).
DATABASES = {
    "weaviate": "apps.vdb.weaviate",
    "milvus": "apps.vdb.milvus",
    "qdrant": "apps.vdb.qdrant",
    "pgvector": "apps.vdb.pgvector",
    "lancedb": "apps.vdb.lancedb",
    "faiss": "apps.vdb.faiss",
}


def database(name: str) -> Database:
    """The declaration of database ``name`` (ValueError naming the known ones otherwise)."""
    try:
        package = DATABASES[name]
    except KeyError:
        raise ValueError(f"unknown database {name!r}; known: {', '.join(sorted(DATABASES))}") from None
    declared = importlib.import_module(package).DATABASE
    if not isinstance(declared, Database) or declared.name != name:
        raise TypeError(f"{package}.DATABASE must be a Database named {name!r}")
    return declared


def databases() -> list[Database]:
    """Every registered database's declaration, in registry order."""
    return [database(name) for name in DATABASES]


def runs_in_process(settings: Any) -> bool:
    """True when ``settings`` (a ``vdb.databases`` entry; None: False) run their engine inside the client
    process: there is no server to deploy and no pilot job."""
    return settings is not None and database(settings.name).runs_in_process(settings)
