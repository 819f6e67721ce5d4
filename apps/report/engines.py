"""The report's "Engines, index types and media" table: what each point of a run built, and where.

One row per point (label): the engine and its version, the index type with its build parameters, the
quantisation, what the sweep's ``ef`` meant for it (HNSW ef, IVF nprobe, ...) and the medium the collection
lived on. Read from the ``params`` JSON the deploy and index rows carry (the collection and the database
settings of the point), so it needs nothing but ``results.parquet``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from apps.evaluate.results import point_name
from apps.vdb.base import SEARCH_KNOB
from apps.vdb.capabilities import storage_medium
from core.format import table

QUANTIZATION = {"none": "—", "scalar": "scalar (int8)", "pq": "product (PQ)", "bq": "binary (BQ)"}


def _params(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Point name -> {"database", "version", "collection", "settings"} from its first row with params."""
    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = point_name(row)
        if name in found or not row.get("params"):
            continue
        try:
            params = json.loads(row["params"])
        except (TypeError, ValueError):
            continue
        if isinstance(params, dict) and isinstance(params.get("collection"), dict):
            found[name] = {
                "database": row["database"],
                "version": row.get("server_version"),
                "collection": params["collection"],
                "settings": params.get("settings") or {},
            }
    return found


def index_parameters(collection: dict[str, Any], settings: dict[str, Any]) -> str:
    """The build parameters that matter for the collection's index type, e.g. ``M=16, efc=128``."""
    index = collection.get("index_type")
    parts = []
    if index in ("ivf_flat", "ivf_pq", "ivf_hnsw_sq"):
        parts.append(f"nlist={collection.get('ivf_nlist')}")
    if index in ("hnsw", "dynamic", "ivf_hnsw_sq"):
        parts.append(f"M={collection.get('hnsw_m')}, efc={collection.get('ef_construction')}")
    if index == "ivf_pq" or collection.get("quantization") == "pq":
        parts.append(f"pq_m={collection.get('pq_m')}×{collection.get('pq_bits')} bits")
    if index == "ivf_hnsw_sq" and settings.get("nprobes"):
        parts.append(f"nprobes={settings['nprobes']}")
    if index == "flat":
        parts.append("exact scan")
    return ", ".join(parts) or "—"


def medium(database: str, collection: dict[str, Any], settings: dict[str, Any]) -> str:
    """Where the collection lived (apps/vdb/capabilities.storage_medium; "—" for an unknown database)."""
    try:
        return storage_medium(database, collection, settings)
    except (KeyError, ImportError):
        return "—"


def engine_facts(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Point name -> engine, version, index, quantisation, parameters, search knob and medium."""
    facts = {}
    for name, found in _params(rows).items():
        collection, settings, database = found["collection"], found["settings"], found["database"]
        index = collection.get("index_type") or "—"
        engine = database if settings.get("mode") in (None, "server") else f"{database} ({settings['mode']})"
        facts[name] = {
            "engine": engine,
            "version": found["version"] or "—",
            "index": index,
            "quantization": QUANTIZATION.get(collection.get("quantization") or "none", "—"),
            "parameters": index_parameters(collection, settings),
            "knob": SEARCH_KNOB.get(index, "—"),
            "medium": medium(database, collection, settings),
        }
    return facts


def engines_section(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown lines of the section ([] when no row carries its point's parameters)."""
    facts = engine_facts(rows)
    if not facts:
        return []
    header = ["point", "engine", "version", "index", "quantisation", "index parameters", "ef is", "medium"]
    lines = [
        "## Engines, index types and media",
        "",
        "What each point built and where it kept it; the tables and figures below name points by the "
        "first column. `ef is`: what the query sweep's ef set for that index (HNSW ef, IVF nprobe).",
        "",
    ]
    keys = ("engine", "version", "index", "quantization", "parameters", "knob", "medium")
    body = [[name, *(facts[name][k] for k in keys)] for name in sorted(facts)]
    return [*lines, *table(header, body), ""]
