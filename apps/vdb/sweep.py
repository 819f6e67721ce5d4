"""Sweeps of the ``vdb`` section: lists written where the model expects one value become points.

Any scalar field of the ``vdb`` section (``rows``, ``startup_timeout_s``, ...), of ``vdb.collection``,
``vdb.insert``, ``vdb.query`` (its scalars: its lists are the query sweep), ``vdb.cluster`` (and its
nested sections) and of a database entry under ``vdb.databases`` may be written as a list: each value
is one value of a sweep axis. Fields that are lists by nature (``insert.batch_sizes``, ``query.ef``,
``optional``, ...) are never axes: the model's annotation decides, so a field added later is sweepable
without being listed here. ``sweep: cartesian`` crosses the axes, ``sweep: zip`` pairs them (equal
lengths), ``repeats: N`` measures every point N times.

A database entry may carry ``label`` (its unique name in the report) and ``collection`` / ``insert``
overrides of the shared sections, so one run can hold the same database several times (milvus with
hnsw and milvus with ivf_pq). Each point is validated as an ordinary single-database ``vdb`` section;
an error names the field as written and the index of the bad value in its list.

This module works on the raw (parsed YAML) data and the models' annotations only: no pipeline import.

## Labels

Each point's unique name in the report, and the file name it becomes. An entry's label is its ``label``
(or its database's name) followed by the values swept in it: ``milvus[index_type=ivf_pq,hnsw_m=32]``. The
label names the point's link in the stage directory and its figure files, so two labels that would become
one file name are refused like a label used twice.
"""

from __future__ import annotations

import copy
import itertools
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails

# Keys of a database entry that are not fields of the database's settings model.
# A section an entry overrides is merged into the shared one key by key, nested sections too (an entry's
# ``cluster: {storage: {medium: ssd}}`` keeps the shared storage paths).
ENTRY_SECTIONS = ("collection", "insert", "query", "cluster", "mixed")
# Single fields of the vdb section an entry may override too (one value or a sweep list).
ENTRY_FIELDS = ("cores_per_worker", "bind")
ENTRY_KEYS = ("label", *ENTRY_SECTIONS, *ENTRY_FIELDS)
ENTRY_OWN = (*ENTRY_SECTIONS, *ENTRY_FIELDS)  # entry paths that are not the database's settings
# Fields of the vdb section that shape the sweep itself, or are lists by nature.
NOT_AXES = ("sweep", "repeats", "databases", "optional")

Path = tuple[Any, ...]


class LabelError(ValueError):
    """A label that cannot name a point, with the location (in the ``vdb`` section) to blame."""

    def __init__(self, loc: tuple[Any, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def label_slug(label: str) -> str:
    """A label as a file name (its points' directory links and figure files): ``milvus[hnsw_m=32]`` stays
    readable. Leading dots go (``.`` and ``..`` name directories, not points); an empty result is
    ``point``."""
    return re.sub(r"[^A-Za-z0-9._=,+\[\]-]+", "_", label)[:120].lstrip(".") or "point"


def _short(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def default_label(name: str, params: dict[str, Any]) -> str:
    """``milvus`` or ``milvus[index_type=ivf_pq,hnsw_m=32]`` (last name part, whole name when ambiguous)."""
    if not params:
        return name
    last = [p.rsplit(".", 1)[-1] for p in params]
    parts = [
        f"{short if last.count(short) == 1 else full}={_short(v)}"
        for (full, v), short in zip(params.items(), last, strict=True)
    ]
    return f"{name}[{','.join(parts)}]"


class PointLabels:
    """The labels given so far in one ``vdb`` section, each owned by one database entry."""

    def __init__(self) -> None:
        self.owner: dict[str, int] = {}  # label -> the entry it belongs to
        self.files: dict[str, str] = {}  # casefolded file name -> the label that has it

    def claim(self, entry: dict[str, Any], index: int, params: dict[str, Any], swept: dict[str, Any]) -> str:
        """The label of entry ``index``'s point with ``params`` (``swept``: its entry's own axes).

        Raises LabelError for a label that is not a string, is another entry's, or would share another
        label's file name (case ignored: on macOS ``HNSW`` and ``hnsw`` are one file).
        """
        label = entry.get("label")
        if label is not None and not isinstance(label, str):
            raise LabelError(
                ("databases", index, "label"),
                f"label must be a string, not {type(label).__name__}; quote it in YAML",
            )
        if label is None:
            label = default_label(str(entry.get("name")), params)
        elif swept:
            label = default_label(label, swept)
        where = ("databases", index, "label") if "label" in entry else ("databases", index)
        if self.owner.setdefault(label, index) != index:
            raise LabelError(
                where,
                f"label {label!r} is already the label of vdb.databases[{self.owner[label]}]; "
                "give one of them its own label",
            )
        other = self.files.setdefault(label_slug(label).casefold(), label)
        if other != label:
            raise LabelError(
                where,
                f"label {label!r} and label {other!r} would share the file name {label_slug(label)!r} "
                "(characters outside A-Z a-z 0-9 . _ = , + [ ] - become _, leading dots go, case is "
                "ignored, and names are cut at 120 characters); give one of them another label",
            )
        return label


class SweepError(ValueError):
    """A sweep that cannot be expanded, with the location (in the ``vdb`` section) of the cause."""

    def __init__(self, loc: Path, message: str) -> None:
        super().__init__(message)
        self.loc = loc

    def details(self, value: Any) -> InitErrorDetails:
        """This error as one of a ValidationError's line errors."""
        return _value_error(self.loc, str(self), value)


@dataclass(frozen=True)
class Axis:
    """One list written where one value is expected: its path in the ``vdb`` section and its values."""

    path: Path  # e.g. ("collection", "hnsw_m") or ("databases", 1, "nodes")
    name: str  # the parameter's name in results: "collection.hnsw_m", "weaviate.nodes"
    values: list[Any]


@dataclass(frozen=True)
class SweepPoint:
    """One point of the sweep: a database entry with one value per axis, measured ``repeat``-th time.

    ``config`` is an ordinary, validated ``VdbConfig`` holding this one database: the chain of stages reads
    every knob from it exactly as it would from an unswept section.
    """

    label: str  # unique per entry x swept values (repeats share it)
    entry: int  # position of the database entry in vdb.databases
    repeat: int  # 0 .. repeats - 1
    params: dict[str, Any]  # swept values (and the entry's own overrides) by parameter name
    config: Any  # VdbConfig with databases == [this point's settings]
    taken: dict[Path, int] = field(default_factory=dict)  # axis path -> index of the value taken

    @property
    def database(self) -> str:
        """The database's registry name."""
        return self.config.databases[0].name

    @property
    def settings(self) -> Any:
        """The database settings of this point."""
        return self.config.databases[0]


@dataclass
class Expansion:
    """What a written ``vdb`` section expands to."""

    base: dict[str, Any]  # the section with first values, entry keys removed (validates as before)
    points: list[tuple[str, int, int, dict[str, Any], dict[str, Any], dict[Path, int]]] = field(
        default_factory=list
    )  # (label, entry, repeat, params, raw point section, axis path -> index of the value taken)
    axes: list[Axis] = field(default_factory=list)  # every axis, shared and per entry
    entry_keys: dict[int, dict[str, Any]] = field(default_factory=dict)  # label / overrides as written


# --- the models' annotations ------------------------------------------------------------------------------


def _unwrap(annotation: Any) -> Any:
    """Annotated[X, ...] -> X; Optional[X] -> X (a union with None)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return annotation


def _leaves(values: dict[str, Any], path: Path) -> list[Path]:
    """The paths of the non-mapping values in ``values`` (nested mappings walked)."""
    out: list[Path] = []
    for key, value in values.items():
        out += _leaves(value, (*path, key)) if isinstance(value, dict) and value else [(*path, key)]
    return out


def merged(shared: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``shared`` with ``override`` written over it, nested mappings merged key by key (copies); an empty
    mapping clears the shared one (``overrides: {}``)."""
    out = copy.deepcopy(shared)
    for key, value in override.items():
        if isinstance(value, dict) and value and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _model(annotation: Any) -> type[BaseModel] | None:
    annotation = _unwrap(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _is_collection(annotation: Any) -> bool:
    """True for list / tuple / set / dict annotations (also inside a union): a list there is no axis."""
    annotation = _unwrap(annotation)
    origin = typing.get_origin(annotation) or annotation
    if origin in (Union, types.UnionType):
        return any(_is_collection(a) for a in typing.get_args(annotation))
    return isinstance(origin, type) and issubclass(origin, list | tuple | set | frozenset | dict)


def _dict_value(annotation: Any) -> Any | None:
    annotation = _unwrap(annotation)
    if typing.get_origin(annotation) is dict:
        return typing.get_args(annotation)[1]
    return None


def find_axes(raw: dict[str, Any], model: type[BaseModel], path: Path, name: str, skip=()) -> list[Axis]:
    """Lists written in ``raw`` where ``model`` expects one value, recursing into nested sections."""
    axes: list[Axis] = []
    for key, value in raw.items():
        info = model.model_fields.get(key) if isinstance(key, str) else None
        if info is None or key in skip:
            continue  # unknown keys: the model's validation names them
        where, called = (*path, key), f"{name}.{key}" if name else key
        nested, values = _model(info.annotation), _dict_value(info.annotation)
        if nested is not None and isinstance(value, dict):
            axes += find_axes(value, nested, where, called)
        elif values is not None and isinstance(value, dict):
            inner = _model(values)
            for k, v in value.items():
                if inner is not None and isinstance(v, dict):
                    axes += find_axes(v, inner, (*where, k), f"{called}.{k}")
                elif inner is None and isinstance(v, list) and not _is_collection(values):
                    axes.append(_axis((*where, k), f"{called}.{k}", v))
        elif isinstance(value, list) and not _is_collection(info.annotation):
            axes.append(_axis(where, called, value))
    return axes


def _axis(path: Path, name: str, values: list[Any]) -> Axis:
    if not values:
        raise SweepError(path, "an empty list sweeps nothing; write one value or several")
    return Axis(path, name, list(values))


def _dotted(path: Path) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def settings_model(entry: dict[str, Any], models: list[type[BaseModel]]) -> type[BaseModel] | None:
    """The settings model whose ``name`` literal is the entry's name (None: validation will say)."""
    for model in models:
        info = model.model_fields.get("name")
        literal = info is not None and typing.get_origin(info.annotation) is Literal
        if literal and entry.get("name") in typing.get_args(info.annotation):
            return model
    return None


# --- expansion --------------------------------------------------------------------------------------------


def _get(raw: dict[str, Any], path: Path) -> Any:
    for part in path:
        raw = raw[part]
    return raw


def _set(raw: Any, path: Path, value: Any) -> None:
    for part in path[:-1]:
        raw = raw[part]
    raw[path[-1]] = value


def _combinations(axes: list[Axis], mode: str) -> list[tuple[int, ...]]:
    """Indexes into each axis' values, one tuple per combination."""
    if not axes:
        return [()]
    if mode == "zip":
        lengths = {len(a.values) for a in axes}
        if len(lengths) > 1:
            shown = ", ".join(f"vdb.{_dotted(a.path)} has {len(a.values)}" for a in axes)
            raise SweepError(("sweep",), f"zip pairs lists of equal length: {shown}")
        return [tuple(i for _ in axes) for i in range(lengths.pop())]
    return list(itertools.product(*(range(len(a.values)) for a in axes)))


def expand(raw: dict[str, Any], vdb_model: type[BaseModel], models: list[type[BaseModel]]) -> Expansion:
    """The points of a written ``vdb`` section (entries x combinations x repeats), not yet validated.

    Raises SweepError for an empty list, lists of unequal length under zip, and a label used twice.
    """
    mode, repeats = raw.get("sweep", "cartesian"), raw.get("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool):
        repeats = 1  # the model's validation reports the bad value
    shared = {k: v for k, v in raw.items() if k not in ("databases",)}
    shared_axes = find_axes(shared, vdb_model, (), "", skip=NOT_AXES)
    entries = raw.get("databases")
    if not isinstance(entries, list):
        return Expansion(base=raw)  # validation names the problem
    base = copy.deepcopy(shared)
    for axis in shared_axes:
        _set(base, axis.path, axis.values[0])
    base["databases"] = []
    out = Expansion(base=base, axes=list(shared_axes))
    labels = PointLabels()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            base["databases"].append(entry)
            continue
        settings = {k: v for k, v in entry.items() if k not in ENTRY_KEYS}
        out.entry_keys[i] = {k: entry[k] for k in ENTRY_KEYS if k in entry}
        model = settings_model(entry, models)
        own = (
            find_axes(settings, model, ("databases", i), str(entry.get("name")), skip=("name",))
            if model
            else []
        )
        overridden: set[Path] = set()
        fixed: dict[str, Any] = {}  # the entry's own overrides that are single values: part of its label
        for section in ENTRY_SECTIONS:
            values = entry.get(section)
            if values is None:
                continue
            if not isinstance(values, dict):
                raise SweepError(("databases", i, section), f"a mapping of {section} fields, not {values!r}")
            section_model = _model(vdb_model.model_fields[section].annotation)
            own += find_axes(values, section_model, ("databases", i, section), section)
            overridden |= set(_leaves(values, (section,)))
            for leaf in _leaves(values, ()):
                value = _get(values, leaf)
                if not isinstance(value, list):
                    fixed[".".join(map(str, (section, *leaf)))] = value
        # A shared axis the entry overrides (its field, or a section above it written as one value) is not
        # this entry's axis.
        for name in ENTRY_FIELDS:
            if name in entry:
                own += find_axes({name: entry[name]}, vdb_model, ("databases", i), "")
                overridden.add((name,))
                if not isinstance(entry[name], list):
                    fixed[name] = entry[name]
        axes = [a for a in shared_axes if not any(a.path[: len(o)] == o for o in overridden)] + own
        out.axes += own
        first = copy.deepcopy(settings)
        for axis in own:
            if axis.path[2] not in ENTRY_OWN:
                _set(first, axis.path[2:], axis.values[0])
        base["databases"].append(first)
        for combination in _combinations(axes, mode):
            point = copy.deepcopy(shared)
            point.pop("sweep", None), point.pop("repeats", None)
            point["optional"] = []
            point["databases"] = [copy.deepcopy(settings)]
            for section in ENTRY_SECTIONS:
                if section in entry:
                    point[section] = merged(shared.get(section) or {}, entry[section])
            for name in ENTRY_FIELDS:
                if name in entry:
                    point[name] = copy.deepcopy(entry[name])
            params = dict(fixed)
            taken: dict[Path, int] = {}
            for axis, index in zip(axes, combination, strict=True):
                local = axis.path if axis.path[0] != "databases" else axis.path[2:]
                if axis.path[0] == "databases" and axis.path[2] not in ENTRY_OWN:
                    local = ("databases", 0, *axis.path[2:])
                _set(point, local, axis.values[index])
                params[axis.name] = axis.values[index]
                taken[axis.path] = index
            swept = {axis.name: params[axis.name] for axis in axes}
            try:
                label = labels.claim(entry, i, params, swept)
            except LabelError as exc:
                raise SweepError(exc.loc, str(exc)) from None
            for repeat in range(repeats):
                out.points.append((label, i, repeat, params, point, taken))
    return out


def validate_points(
    expansion: Expansion,
    handler: Callable[[dict[str, Any]], Any],
    check: Callable[[Any, int], list[tuple[tuple, str]]],
) -> list[SweepPoint]:
    """Validate every point as an ordinary section; errors name the written field and the list index.

    ``check(config, entry)`` returns (location in the point, message) for the cross-field checks that need
    the point's own values (index types).
    """
    points: list[SweepPoint] = []
    errors: dict[tuple, InitErrorDetails] = {}
    validated: dict[int, Any] = {}  # repeats of one combination share the validated section
    for label, entry, repeat, params, raw, taken in expansion.points:
        key = id(raw)
        if key not in validated:
            try:
                validated[key] = handler(raw)
                for local, message in check(validated[key], entry):
                    loc = written_loc(local, entry, raw, expansion, taken)
                    errors.setdefault((loc, message), _value_error(loc, message, _at(raw, local)))
                    validated[key] = None
            except ValidationError as exc:
                for err in exc.errors():
                    loc = written_loc(tuple(err["loc"]), entry, raw, expansion, taken)
                    errors.setdefault(
                        (loc, err["msg"]),
                        InitErrorDetails(
                            type=err["type"], loc=loc, input=err["input"], ctx=err.get("ctx", {})
                        ),
                    )
                validated[key] = None
        if validated[key] is not None:
            points.append(SweepPoint(label, entry, repeat, params, validated[key], taken))
    if errors:
        raise ValidationError.from_exception_data("VdbConfig", list(errors.values()))
    return points


def _at(raw: dict[str, Any], loc: tuple) -> Any:
    """The value a point holds at ``loc`` (None when absent: a default)."""
    try:
        return _get(raw, loc)
    except (KeyError, IndexError, TypeError):
        return None


def _value_error(loc: tuple, message: str, raw: Any) -> InitErrorDetails:
    from pydantic_core import PydanticCustomError

    return InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=raw)


def written_loc(
    loc: tuple, entry: int, raw: dict[str, Any], expansion: Expansion, taken: dict[Path, int]
) -> tuple:
    """A point's error location -> where the user wrote the value (and which list item it was)."""
    if loc[:2] == ("databases", 0):
        rest = loc[2:]
        name = raw["databases"][0].get("name") if isinstance(raw["databases"][0], dict) else None
        if rest and rest[0] == name:  # the discriminated union's tag
            rest = rest[1:]
        written = ("databases", entry, *rest)
    elif _written_by_entry(expansion.entry_keys.get(entry, {}), loc, expansion.base):
        written = ("databases", entry, *loc)
    else:
        written = loc
    for path, index in taken.items():
        if written[: len(path)] == path:
            return (*path, index, *written[len(path) :])
    return written


def _written_by_entry(own: dict[str, Any], loc: tuple, shared: dict[str, Any]) -> bool:
    """True when the field at ``loc`` is the entry's (``own``: its sections and fields as written): the
    entry writes it, or a value that replaces everything under it. Sections merge key by key, so a key
    the entry's mapping lacks is the shared section's where that writes it (``storage: {medium: lustre}``
    keeps the shared ``lustre_path``); a default neither writes is placed where the entry would add it."""
    if not loc or loc[0] not in ENTRY_OWN or loc[0] not in own:
        return False
    node: Any = own[loc[0]]
    for depth, part in enumerate(loc[1:], start=1):
        if not (isinstance(node, dict) and node):  # a value, a list, or {} that clears the shared one
            return True
        if part not in node:
            return depth > 1 and _at(shared, loc) is None
        node = node[part]
    return True


def restore(dumped: dict[str, Any], expansion: Expansion) -> dict[str, Any]:
    """The dump of the base section with the lists, labels and overrides written back (a round trip)."""
    out = copy.deepcopy(dumped)
    for axis in expansion.axes:
        if axis.path[0] == "databases" and axis.path[2] in ENTRY_OWN:
            continue  # written back with the entry's overrides below
        try:
            _set(out, axis.path, list(axis.values))
        except (KeyError, IndexError, TypeError):
            continue
    for i, keys in expansion.entry_keys.items():
        if i < len(out.get("databases", [])):
            out["databases"][i].update(copy.deepcopy(keys))
    return out
