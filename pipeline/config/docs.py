"""Generate ``docs/configuration.md`` from the pydantic models, so the reference cannot drift.

``python -m pipeline.config.docs > docs/configuration.md``; a test fails when the file is stale.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from core.format import table
from pipeline.config import variants
from pipeline.config.model import RunConfig


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Pydantic models mentioned in a type annotation (through unions, lists, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(_models_in(arg))
    return found


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(annotation))}]"
    if isinstance(annotation, type):
        return "null" if annotation is type(None) else annotation.__name__
    return str(annotation)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(see section)"
        return "(see section)" if isinstance(value, BaseModel) else f"`{value!r}`"
    if field.default is PydanticUndefined:
        return "**required**"
    return f"`{field.default!r}`"


def _section(model: type[BaseModel], path: str, seen: set[tuple[str, type]]) -> list[str]:
    if (path, model) in seen:
        return []
    seen.add((path, model))
    doc = (model.__doc__ or "").strip().splitlines()[0] if model.__doc__ else ""
    lines = [
        f"## `{path}` — {model.__name__}",
        "",
        doc,
        "",
    ]
    rows: list[tuple[str, str, str, str]] = []
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        subs = _models_in(field.annotation)
        if not field.description and len(subs) > 1:
            field_doc = "One of the sections below, chosen by its discriminator field."
        elif not field.description and subs and subs[0].__doc__:
            field_doc = subs[0].__doc__.strip().splitlines()[0]  # a section: its model's summary
        else:
            field_doc = field.description or ""
        rows.append((f"`{name}`", _type_name(field.annotation), _default(field), field_doc))
        for sub in subs:
            nested.append((f"{path}.{name}" if path != "(top level)" else name, sub))
    lines += [*table(["field", "type", "default", "description"], rows, limit=None), ""]
    for sub_path, sub in nested:
        lines.extend(_section(sub, sub_path, seen))
    return lines


def render() -> str:
    """The whole configuration reference as Markdown."""
    header = [
        "# Configuration reference",
        "",
        "Generated from the pydantic models in `pipeline/config/model.py` and the database adapters by",
        "`python -m pipeline.config.docs > docs/configuration.md`; do not edit by hand.",
        "Unknown keys are rejected everywhere. String values may use `${VAR}` or `${VAR:-default}` "
        "(the default also when VAR is set to nothing, as in a shell); `validate` names every unset "
        "variable at once, and an error about a value that came from one says how the file writes it "
        "(`got 'bogus', written as ${ALLOCATION:-separate}`).",
        "Paths of input data are relative to the configuration file; `workdir` to the current directory.",
        "A union of sections is chosen by its `method`, `platform` or `name` field.",
        "",
    ]
    return "\n".join(header + _section(RunConfig, "(top level)", set()) + _datasets_section()).rstrip() + "\n"


def _datasets_section() -> list[str]:
    """The top-level ``datasets`` section: not a model field (the loader applies it), so its rules are
    the module's docstring, written once."""
    text = (
        (variants.__doc__ or "")
        .strip()
        .replace(
            ":data:`~pipeline.config.model.GENERATING_SECTIONS`",
            ", ".join(variants.GENERATING_SECTIONS),
        )
    )
    return [f"## `{variants.SECTION}` — one config, several datasets", "", text, ""]


if __name__ == "__main__":
    print(render(), end="")
