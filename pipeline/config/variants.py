"""A config's other datasets: the top-level ``datasets:`` section, one entry per dataset of a study.

One file holds a study (the Pes2o-VE study's Table I: Pes2o-VE, GIST, dbpedia-openai, Yandex-T2I): the
file's own sections describe its first dataset, and each entry of ``datasets`` is a set of sections that
turns the file into another dataset's run. ``--dataset NAME`` picks one, ``--dataset all`` each in turn.

How an entry applies to the file (one rule each, so a reader can tell the result from the text):

* it must have its own ``dataset`` section, which replaces the file's (a dataset's size, name and source
  go together);
* when that section names ``imported`` or ``stored``, the sections only a generated dataset has
  (:data:`~pipeline.config.model.GENERATING_SECTIONS`) are left out;
* its other sections merge into the file's mapping by mapping: a list or a value replaces, ``null`` removes
  the file's value, so the field takes its default (limits such as ``vdb.query.max_queries`` and the
  timeouts are the file's unless the entry writes them); a variable only what it replaces or removes
  reads need not be set;
* the run's ``name`` is the file's with ``-<entry>`` appended, and ``dataset.name`` is the entry's name,
  unless the entry sets them.

The result is an ordinary config: it is what a run records, so ``report`` rewrites it without the file.
"""

from __future__ import annotations

import re
from typing import Any

from core.store import SAFE_NAME, SAFE_NAME_RULE
from pipeline.config.model import GENERATING_SECTIONS, RunConfig

__all__ = ["ALL", "GENERATING_SECTIONS", "SECTION", "entry_problem", "merged", "pruned"]

SECTION = "datasets"
ALL = "all"  # --dataset all: the file's own dataset, then every entry
_NAME = re.compile(SAFE_NAME)


def entry_problem(name: Any, entry: Any, base: dict[str, Any]) -> str | None:
    """Why ``datasets.<name>`` cannot be an entry of the file ``base``, or None."""
    if not isinstance(name, str) or not _NAME.match(name):
        return f"{name!r} is not a dataset entry name ({SAFE_NAME_RULE})"
    if name == ALL:
        return f"'{ALL}' is reserved for --dataset {ALL} (every dataset of the file)"
    if not isinstance(entry, dict) or not entry:
        return "an entry is a mapping of the sections that differ from the file's (dataset:, vdb:, ...)"
    unknown = [str(key) for key in entry if key not in RunConfig.model_fields]
    if unknown:  # checked here, not only when the entry runs: `validate FILE` tells of a misspelt section
        known = ", ".join(key for key in RunConfig.model_fields)
        return f"{unknown[0]!r} is not a section of a config (sections: {known})"
    if not isinstance(entry.get("dataset"), dict):
        return (
            "an entry needs its own dataset: section (imported or stored names its files; its name defaults "
            "to the entry's)"
        )
    if not _given(entry) and "corpus" not in base and "corpus" not in entry:
        return (
            "its dataset names neither imported nor stored, and the file has no corpus and embedding to "
            "generate one from: name its files (dataset.imported) or a stored dataset (dataset.stored)"
        )
    return None


def _given(entry: dict[str, Any]) -> bool:
    """True when the entry's dataset is imported or stored, not generated."""
    return any(key in entry["dataset"] for key in ("imported", "stored"))


def pruned(base: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The file's sections that stay under ``entry``, before either is interpolated: what the entry
    removes (``null``, a given dataset's generating sections) or replaces (the ``dataset`` section, a list
    such as ``vdb.databases``, a value) is gone, so a variable only they use (``${PES2O_CORPUS}``, the
    replaced databases' ``${DAOS_POOL}``) need not be set."""
    dropped = {SECTION, "dataset", *(GENERATING_SECTIONS if _given(entry) else ())}
    return _without_removed({k: v for k, v in base.items() if k not in dropped}, entry)


def merged(base: dict[str, Any], entry: dict[str, Any], name: str) -> dict[str, Any]:
    """``entry`` applied to the (pruned, interpolated) file: a new dict, nothing shared is changed."""
    result = _merge(base, _without_nulls(entry))
    if "name" not in entry and isinstance(base.get("name"), str):
        result["name"] = f"{base['name']}-{name}"
    result["dataset"] = {"name": name, **result["dataset"]}  # the entry's name unless it gives one
    return result


def _without_removed(base: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """``base`` less what ``entry`` removes or replaces: only two mappings merge (:func:`_merge`)."""
    result = {}
    for key, value in base.items():
        if isinstance(value, dict) and isinstance(entry.get(key), dict):
            result[key] = _without_removed(value, entry[key])
        elif key not in entry:
            result[key] = value
    return result


def _without_nulls(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        key: _without_nulls(value) if isinstance(value, dict) else value
        for key, value in entry.items()
        if value is not None
    }


def _merge(base: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    result = dict(base)
    for key, value in entry.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            result[key] = _merge(base[key], value)
        else:
            result[key] = value
    return result
