"""The field a misspelt key probably meant: ``chunking.chunk_sise`` -> ``did you mean 'chunk_size'?``.

Pydantic says only "Extra inputs are not permitted" of an unknown key. The fields that were allowed
there are read from the config model along the error's location: through optional values, unions
(each member; a discriminated union's tag in the location is skipped), lists and mappings.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel

from apps.vdb.sweep import ENTRY_KEYS, ENTRY_SECTIONS

_LISTED = 20  # more fields than this are not listed: the docs' table says them better


def unknown_field_message(model: type[BaseModel], loc: tuple) -> str:
    """What to say of the unknown key at ``loc`` (pydantic's own location, tags included)."""
    parent = loc[:-1]
    entry = parent[:2] == ("vdb", "databases") and len(parent) > 2 and isinstance(parent[2], int)
    own = [i for i, part in enumerate(parent[3:5], 3) if part in ENTRY_SECTIONS] if entry else []
    if own:  # an entry's own collection/insert/...: the fields of vdb's section of that name
        allowed = fields_at(model, ("vdb", *parent[own[0] :]))
    else:
        allowed = fields_at(model, parent)
        if entry and len(parent) <= 4:  # a database entry (its engine's tag after the index)
            allowed = sorted({*allowed, *ENTRY_KEYS})
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
    if close:
        return f"unknown field; did you mean {close[0]!r}?"
    if allowed and len(allowed) <= _LISTED:
        return f"unknown field (fields here: {', '.join(allowed)})"
    return "unknown field"


def tag_field(ctx: dict[str, Any]) -> str:
    """The field whose value picks a union's member (``name``, ``platform``), from pydantic's ``ctx``,
    where it comes quoted (a callable discriminator gives the function's name instead, or nothing)."""
    return str(ctx.get("discriminator", "")).strip("'")


def unknown_tag_message(ctx: dict[str, Any]) -> str:
    """``unknown name 'weviate'; did you mean 'weaviate'?`` for a union's tag (pydantic's ``ctx``:
    ``tag``, ``discriminator``, ``expected_tags``), the choices listed."""
    tag, field = str(ctx.get("tag")), tag_field(ctx)
    expected = [t.strip().strip("'") for t in str(ctx.get("expected_tags", "")).split(",") if t.strip()]
    close = difflib.get_close_matches(tag, expected, n=1, cutoff=0.6)
    meant = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {field or 'name'} {tag!r}{meant} (one of: {', '.join(expected)})"


def fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the model(s) the config model holds at ``loc``; [] when none is found."""
    candidates: list[Any] = [model]
    for part in loc:
        found = [t for c in candidates for t in _step(c, part)]
        if not found:  # a union's tag (``executor.slurm``): the field sits in the same model
            found = [m for c in candidates for m in _members(c) if _is_model(m)]
        candidates = found
    names = {name for c in candidates for m in _members(c) if _is_model(m) for name in m.model_fields}
    return sorted(names)


def _step(tp: Any, part: Any) -> list[Any]:
    """The types one ``part`` further into ``tp`` (a field of a model, an item of a list or mapping)."""
    found = []
    for member in _members(tp):
        origin = typing.get_origin(member)
        if _is_model(member) and isinstance(part, str) and part in member.model_fields:
            found.append(member.model_fields[part].annotation)
        elif origin in (list, tuple, set, frozenset) and isinstance(part, int):
            found.extend(typing.get_args(member)[:1])
        elif origin is dict and isinstance(part, str):
            found.extend(typing.get_args(member)[1:2])
    return found


def _members(tp: Any) -> list[Any]:
    """``tp`` as the types it may be: Annotated and Optional unwrapped, a union split into its members."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _members(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(tp) for m in _members(arg)]
    return [tp]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)
