"""What each database builds beyond its index types: quantisation per index type, on-disk storage, and
limits that depend on where the server runs. Checked when a config is validated (``VdbConfig``), so a
combination a database cannot build fails before any server starts, naming the field and the database.

Each database's ``settings.py`` may declare (pydantic only, no client library):

* ``QUANTIZATIONS``: index type -> the ``vdb.collection.quantization`` values it builds with it
  (absent index type or module attribute: only ``none``);
* ``ON_DISK``: the index types that honour ``vdb.collection.on_disk: true`` (absent: none);
* ``ALWAYS_ON_DISK``: the index types kept on disk whatever ``on_disk`` says (PostgreSQL's and Lance's
  files, Milvus DISKANN; absent: none);
* ``LIMITS``: field name -> why the database refuses other values (appended to the error);
* ``index_problems(settings, collection, cluster)``: further refusals, each ``(field, message)``
  (``cluster``: the ``vdb.cluster`` block or None; e.g. a server build that lacks an index).
"""

from __future__ import annotations

import importlib
from typing import Any

from apps.vdb import DATABASES


def _settings_module(name: str) -> Any:
    return importlib.import_module(f"{DATABASES[name]}.settings")


def quantizations(name: str, index_type: str) -> tuple[str, ...]:
    """The quantisations database ``name`` builds with ``index_type``."""
    return tuple(getattr(_settings_module(name), "QUANTIZATIONS", {}).get(index_type, ("none",)))


def on_disk_index_types(name: str) -> tuple[str, ...]:
    """The index types of database ``name`` that keep vectors on disk when ``on_disk`` is true."""
    return tuple(getattr(_settings_module(name), "ON_DISK", ()))


def storage_medium(name: str, collection: dict[str, Any], settings: dict[str, Any]) -> str:
    """Where database ``name`` kept a collection (``collection``, ``settings``: the dumped models) for the
    report: "memory", "disk (on_disk)" (vectors, and the graph where the database can, read from disk),
    "disk (files)" (always on disk) and LanceDB's ``medium`` ("memory (tmpfs)" for /dev/shm)."""
    module, index = _settings_module(name), collection.get("index_type")
    medium = settings.get("medium")
    if medium == "memory":
        return "memory (tmpfs files)"
    where = f", {medium}" if medium else ""
    if index in getattr(module, "ALWAYS_ON_DISK", ()):
        return f"disk (files{where})"
    if collection.get("on_disk") and index in on_disk_index_types(name):
        return f"disk (on_disk{where})"
    return "memory"


def collection_problems(settings: Any, position: int, collection: Any, cluster: Any) -> list[str]:
    """Why ``vdb.databases[position]`` (``settings``) cannot build ``collection`` (empty: it can)."""
    module, name = _settings_module(settings.name), settings.name
    where = f"vdb.databases[{position}] ({name})"
    limits = getattr(module, "LIMITS", {})

    def because(field: str) -> str:
        return f": {limits[field]}" if field in limits else ""

    index, problems = collection.index_type, []
    builds = quantizations(name, index)
    if collection.quantization not in builds:
        problems.append(
            f"vdb.collection.quantization {collection.quantization!r} with index_type {index!r} is not "
            f"built by {where}; with {index} it builds: {', '.join(builds)}{because('quantization')}"
        )
    disk = on_disk_index_types(name)
    if collection.on_disk and index not in disk:
        problems.append(
            f"vdb.collection.on_disk true with index_type {index!r} is not supported by {where}; on disk "
            f"it builds: {', '.join(disk) or 'nothing'}{because('on_disk')}"
        )
    extra = getattr(module, "index_problems", None)
    if extra is not None:
        for field, message in extra(settings, collection, cluster):
            problems.append(f"vdb.collection.{field} is not supported by {where}: {message}")
    return problems
