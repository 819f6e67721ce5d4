"""What each database builds beyond its index types: quantisation per index type, on-disk storage, and
limits that depend on where the server runs. Checked when a config is validated (``VdbConfig``), so a
combination a database cannot build fails before any server starts, naming the field and the database.

Each database declares them in its :class:`~apps.vdb.declaration.Database` (no client library
imported): ``quantizations`` (index type -> the ``vdb.collection.quantization`` values it builds with it;
an absent index type: only ``none``), ``on_disk`` (the index types that honour ``vdb.collection.on_disk:
true``), ``always_on_disk`` (the index types kept on disk whatever ``on_disk`` says: PostgreSQL's and
Lance's files, Milvus DISKANN), ``limits`` (field name -> why the database refuses other values, appended
to the error) and ``index_problems(settings, collection, cluster)`` (further refusals, each ``(field,
message)``; ``cluster``: the ``vdb.cluster`` block or None; e.g. a server build that lacks an index).
"""

from __future__ import annotations

from typing import Any

from apps.vdb import database


def quantizations(name: str, index_type: str) -> tuple[str, ...]:
    """The quantisations database ``name`` builds with ``index_type``."""
    return database(name).builds_with(index_type)


def on_disk_index_types(name: str) -> tuple[str, ...]:
    """The index types of database ``name`` that keep vectors on disk when ``on_disk`` is true."""
    return database(name).on_disk


def storage_medium(name: str, collection: dict[str, Any], settings: dict[str, Any]) -> str:
    """Where database ``name`` kept a collection (``collection``, ``settings``: the dumped models) for the
    report: "memory", "disk (on_disk)" (vectors, and the graph where the database can, read from disk),
    "disk (files)" (always on disk) and LanceDB's ``medium`` ("memory (tmpfs)" for /dev/shm)."""
    index = collection.get("index_type")
    medium = settings.get("medium")
    if medium == "memory":
        return "memory (tmpfs files)"
    where = f", {medium}" if medium else ""
    if index in database(name).always_on_disk:
        return f"disk (files{where})"
    if collection.get("on_disk") and index in on_disk_index_types(name):
        return f"disk (on_disk{where})"
    return "memory"


def collection_problems(settings: Any, position: int, collection: Any, cluster: Any) -> list[str]:
    """Why ``vdb.databases[position]`` (``settings``) cannot build ``collection`` (empty: it can)."""
    declared, name = database(settings.name), settings.name
    where = f"vdb.databases[{position}] ({name})"
    limits = declared.limits

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
    if declared.index_problems is not None:
        for field, message in declared.index_problems(settings, collection, cluster):
            problems.append(f"vdb.collection.{field} is not supported by {where}: {message}")
    return problems
