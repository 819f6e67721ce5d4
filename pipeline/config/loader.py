"""Read a YAML run configuration: ``${ENV}`` interpolation, validation, errors naming file:line and field."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from core.config import FieldError
from core.errors import ConfigError
from executors.safe import SecretValueError
from pipeline.config import variants
from pipeline.config.model import RunConfig
from pipeline.config.suggest import tag_field, unknown_field_message, unknown_tag_message
from pipeline.config.yaml_guard import dotted_path, parse_yaml

# ${NAME} or ${NAME:-default}
_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class LoadedConfig:
    """A validated configuration with where it came from."""

    config: RunConfig
    path: Path
    node: yaml.Node | None = field(default=None, compare=False, repr=False)
    dataset_entry: str | None = None  # the ``datasets`` entry this config is; None: the file's own dataset
    dataset_entries: tuple[str, ...] = ()  # every entry of the file's ``datasets`` section
    given_path: Path | None = field(default=None, compare=False)  # as the user wrote it: errors name it so

    @property
    def shown_path(self) -> Path:
        """The config file as the user named it (``path`` is resolved): every error names it the same way."""
        return self.given_path or self.path

    def error_at(self, loc: tuple, message: str) -> ConfigError:
        """A ConfigError for the field at ``loc`` (e.g. ("corpus", "paths")), with its line and value."""
        written = self.written_as(loc)
        shown = f" (written as {written})" if written else ""
        text = f"{self.where_prefix}{dotted_path(loc)}: {message}{shown}"
        return ConfigError(text, file=str(self.shown_path), line=self.line_at(loc))

    def line_at(self, loc: tuple) -> int | None:
        """The line that writes the field at ``loc`` (the entry's own where it writes it); None: a default."""
        return _line_in(self.node, loc, self.dataset_entry)

    def written_as(self, loc: tuple) -> str | None:
        """The file's text at ``loc`` when it takes ``${NAME}`` from the environment, else None."""
        return _written_with_variables(self.node, loc, self.dataset_entry)

    @property
    def where_prefix(self) -> str:
        """``dataset gist-1m: `` before a message about an entry's config; empty for the file's own."""
        return _entry_prefix(self.dataset_entry)

    @property
    def base_dir(self) -> Path:
        """Directory that relative data paths in the config are resolved against."""
        return self.path.parent

    def resolved_dict(self) -> dict[str, Any]:
        """The configuration after interpolation and defaults, as plain JSON-able data."""
        return self.config.model_dump(mode="json")

    @property
    def config_hash(self) -> str:
        """sha256 of the canonical JSON of the resolved configuration."""
        canonical = json.dumps(self.resolved_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def load_config(path: str | Path, dataset: str | None = None) -> LoadedConfig:
    """Parse, interpolate and validate ``path``; raise ConfigError naming file, line, field and value.

    ``dataset`` names an entry of the file's ``datasets`` section (:mod:`pipeline.config.variants`):
    the config is then that dataset's run. None: the file's own dataset."""
    path = Path(path)
    node, data, entries, dataset = _parse_named(path, dataset)
    if dataset is None:
        (data,) = _interpolate(path, ({k: v for k, v in data.items() if k != variants.SECTION}, node, ()))
    else:
        entry = entries[dataset]
        where = (variants.SECTION, dataset)
        base, own = _interpolate(
            path, (variants.pruned(data, entry), node, ()), (entry, _at(node, where), where)
        )
        data = variants.merged(base, own, dataset)
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, node, path, dataset) from None
    _refuse_coerced_booleans(data, config, node, path, (), dataset)
    return LoadedConfig(config, path.resolve(), node, dataset, tuple(entries), path)


def dataset_entries(path: str | Path) -> tuple[str, ...]:
    """The names in the file's ``datasets`` section, checked as :func:`load_config` checks them, without
    interpolating or validating the file's own sections (``--dataset all`` goes on past one that fails)."""
    path = Path(path)
    node, data = _parse(path)
    return tuple(_dataset_entries(data, node, path))


def check_dataset_option(path: str | Path, dataset: str | None) -> None:
    """What can be checked of a config before it is sent to run elsewhere (``submit``), where its
    variables take that side's values: it parses, its ``datasets`` section is well formed, and
    ``--dataset`` names the file's own dataset, one of its entries, or all of them."""
    _parse_named(Path(path), None if dataset == variants.ALL else dataset)


def _parse_named(
    path: Path, dataset: str | None
) -> tuple[yaml.Node | None, dict[str, Any], dict[str, dict], str | None]:
    """The file parsed, its ``datasets`` entries checked, and the entry ``--dataset`` names (None for
    the file's own dataset): the first steps of every command that reads a config."""
    node, data = _parse(path)
    entries = _dataset_entries(data, node, path)
    return node, data, entries, _entry_named(dataset, entries, data, node, path)


def _entry_named(
    dataset: str | None, entries: dict[str, dict], data: dict[str, Any], node: yaml.Node | None, path: Path
) -> str | None:
    """The ``datasets`` entry ``--dataset`` names; None for the file's own dataset (also when named by
    its ``dataset.name``, as a script looping over a study's names does); ConfigError for neither."""
    if dataset is None or dataset in entries:
        return dataset
    own = data.get("dataset")
    own_name = own.get("name") if isinstance(own, dict) else None
    if dataset == own_name:
        return None
    known = ", ".join(entries) if entries else "none: the file has no datasets section"
    own_too = f", or name {own_name}," if isinstance(own_name, str) else ""
    raise ConfigError(
        f"--dataset {dataset!r}: not an entry of the config's datasets section (entries: {known}; "
        f"leave --dataset out{own_too} for the file's own dataset)",
        file=str(path),
        line=_line_of(node, (variants.SECTION,)),
    )


def _parse(path: Path) -> tuple[yaml.Node | None, dict[str, Any]]:
    """The YAML node graph and data of ``path``; ConfigError when it cannot be read or is not a mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("configuration file not found", file=str(path)) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a configuration file", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", file=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the configuration ({exc.strerror})", file=str(path)) from None
    node, data = parse_yaml(text, path)
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping of sections (name, corpus, ...)", file=str(path))
    return node, data


def _dataset_entries(data: dict[str, Any], node: yaml.Node | None, path: Path) -> dict[str, dict]:
    """The ``datasets`` section's entries by name; ConfigError naming the entry that is not one."""
    section = data.get(variants.SECTION)
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ConfigError(
            f"{variants.SECTION}: a mapping of dataset entries (name: its sections), "
            f"not {type(section).__name__}",
            file=str(path),
            line=_line_of(node, (variants.SECTION,)),
        )
    for name, entry in section.items():
        problem = variants.entry_problem(name, entry, data)
        if problem:
            where = (variants.SECTION, name)
            raise ConfigError(f"{dotted_path(where)}: {problem}", file=str(path), line=_line_of(node, where))
    for name, entry in section.items():
        _refuse_unknown_entry_fields(data, name, entry, node, path)
    return section


def _refuse_unknown_entry_fields(
    data: dict[str, Any], name: str, entry: dict[str, Any], node: yaml.Node | None, path: Path
) -> None:
    """ConfigError for a field the entry writes that its section does not have (``groundtruth.metrc``),
    found before any of its values is interpolated or checked: a command on the file's own dataset, or
    ``run --dataset all`` before it reaches the entry, would otherwise not see the misspelling."""
    candidate = variants.merged(variants.pruned(data, entry), entry, name)  # values not interpolated
    try:
        RunConfig.model_validate(candidate)
        return
    except ValidationError as exc:
        errors = [err for err in exc.errors() if err["type"] == "extra_forbidden"]
    for err in errors:
        loc = _without_tags(candidate, tuple(err["loc"]))
        if _written_in(entry, loc):  # the entry's own key (the file's are checked with its own dataset)
            where = (variants.SECTION, name, *loc)
            message = unknown_field_message(RunConfig, tuple(err["loc"]))
            raise ConfigError(
                f"{_entry_prefix(name)}{dotted_path(loc)}: {message}",
                file=str(path),
                line=_line_of(node, where),
            )


def _written_in(entry: Any, loc: tuple) -> bool:
    """True when ``entry`` (a ``datasets`` entry's data) itself writes the field at ``loc``."""
    for part in loc:
        in_list = isinstance(entry, list) and isinstance(part, int) and part < len(entry)
        if not (in_list or (isinstance(entry, dict) and part in entry)):
            return False
        entry = entry[part]
    return True


def _written_with_variables(node: yaml.Node | None, loc: tuple, entry: str | None) -> str | None:
    """The text the file writes at ``loc`` when it takes ``${NAME}`` from the environment (the value in an
    error came from there: the user looks at the variable, not the file); None otherwise. A list's items
    that hold variables are joined; a variable set to nothing (and no default) is said to be so."""
    found = _at(node, (variants.SECTION, entry, *loc)) if entry is not None else None
    found = found if found is not None else _at(node, loc)
    items = found.value if isinstance(found, yaml.SequenceNode) else [found]
    texts = [i.value for i in items if isinstance(i, yaml.ScalarNode) and _ENV_PATTERN.search(str(i.value))]
    empty = {
        match.group(1)
        for text in texts
        for match in _ENV_PATTERN.finditer(text)
        if match.group(2) is None and os.environ.get(match.group(1)) == ""
    }
    return ", ".join(texts + [f"{name} is set to nothing" for name in sorted(empty)]) or None


def _at(node: yaml.Node | None, loc: tuple) -> yaml.Node | None:
    for part in loc:
        node = _child(node, part)
    return node


def _refuse_coerced_booleans(
    value: Any, model: Any, node: yaml.Node | None, path: Path, where: tuple, entry: str | None
) -> None:
    """A YAML ``true``/``false`` that validation turned into a number (``workers: true`` -> 1) is an error.

    Walks the parsed data beside the validated models, so every config model is covered at once.
    """
    if isinstance(value, bool):
        if not isinstance(model, bool) and isinstance(model, int | float):
            raise ConfigError(
                f"{_entry_prefix(entry)}{dotted_path(where)}: a boolean ({value}) where a number is expected",
                file=str(path),
                line=_line_in(node, where, entry),
            )
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(model, dict) and key in model:
                sub = model[key]
            elif isinstance(model, BaseModel) and isinstance(key, str) and key in type(model).model_fields:
                sub = getattr(model, key)
            else:
                continue
            _refuse_coerced_booleans(item, sub, node, path, (*where, key), entry)
    elif isinstance(value, list) and isinstance(model, list | tuple) and len(model) == len(value):
        for i, (item, sub) in enumerate(zip(value, model, strict=True)):
            _refuse_coerced_booleans(item, sub, node, path, (*where, i), entry)


def _interpolate(path: Path, *parts: tuple[Any, yaml.Node | None, tuple]) -> list[Any]:
    """Each part's value (with its YAML node and field path) with ${NAME} / ${NAME:-default} replaced in
    every string scalar, keeping structure. The default, as in a shell, also stands in for a variable set
    to nothing. Every unset variable of every part is named in one error."""
    missing: list[tuple[str, int | None, tuple]] = []
    result = [_substitute(value, node, path, where, missing) for value, node, where in parts]
    if missing:
        first: dict[str, tuple[int | None, tuple]] = {}  # each variable where it is first used
        for name, line, at in missing:
            first.setdefault(name, (line, at))
        (name, (line, at)), *rest = first.items()
        others = ", ".join(f"{n} ({f'line {ln}, ' if ln else ''}{dotted_path(w)})" for n, (ln, w) in rest)
        raise ConfigError(
            f"{dotted_path(at)}: environment variable {name} is not set "
            f"(use ${{{name}:-default}} for a default)" + (f"; also not set: {others}" if others else ""),
            file=str(path),
            line=line,
        )
    return result


def _substitute(value: Any, node: yaml.Node | None, path: Path, where: tuple, missing: list) -> Any:
    """``_interpolate``'s walk: unset variables without a default are appended to ``missing``."""
    if isinstance(value, dict):
        return {k: _substitute(v, _child(node, k), path, (*where, k), missing) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, _child(node, i), path, (*where, i), missing) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value
    # An unclosed "${HOME": taken as text, it fails far from here. A closed one that is not ours
    # ("${PBS_NODEFILE%/*}" in worker_init) is shell for the job script and passes as written.
    if re.search(r"\$\{[^}]*$", _ENV_PATTERN.sub("", value)):
        raise ConfigError(
            f"{dotted_path(where)}: {value!r} has a '${{' that no '}}' closes (write ${{NAME}} or "
            "${NAME:-default})",
            file=str(path),
            line=node.start_mark.line + 1 if node is not None else None,
        )

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if os.environ.get(name):
            return os.environ[name]
        if default is not None:
            return default
        if name in os.environ:  # set to nothing, no default: nothing, as in a shell
            return ""
        missing.append((name, node.start_mark.line + 1 if node is not None else None, where))
        return match.group(0)

    return _ENV_PATTERN.sub(substitute, value)


def _child(node: yaml.Node | None, key: str | int) -> yaml.Node | None:
    """The YAML node under ``node`` for a mapping key or sequence index (None when absent)."""
    if isinstance(node, yaml.MappingNode):
        # The last: PyYAML puts a merge's (<<: *anchor) keys before the mapping's own, which override them.
        for key_node, value_node in reversed(node.value):
            if key_node.value == key:
                return value_node
    elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
        return node.value[key]
    return None


def _line_of(node: yaml.Node | None, loc: tuple) -> int | None:
    """Line of the deepest YAML node that exists along ``loc`` (1-based)."""
    return _deepest(node, loc)[0]


def _line_in(node: yaml.Node | None, loc: tuple, entry: str | None) -> int | None:
    """Line of the field at ``loc`` of a config that is the ``datasets`` entry ``entry`` (or the file's own):
    the entry's line where the entry writes the field (as deep as the file does), the file's otherwise."""
    line, depth = _deepest(node, loc)
    if entry is not None:
        in_entry, entry_depth = _deepest(node, (variants.SECTION, entry, *loc))
        if entry_depth - 2 >= max(depth, 1):
            return in_entry
    return line


def _deepest(node: yaml.Node | None, loc: tuple) -> tuple[int | None, int]:
    """(line, how many parts of ``loc`` exist) of the deepest node along ``loc``."""
    line, depth = None, 0
    for part in loc:
        if node is None:
            break
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in reversed(node.value):  # the last: a merge's keys come first
                if key_node.value == part:
                    line, depth = key_node.start_mark.line + 1, depth + 1
                    node = value_node
                    break
            # not found: a missing field, or a union tag such as 'recursive' in the loc; keep the parent
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line, depth = node.start_mark.line + 1, depth + 1
    return line, depth


def _without_tags(tree: Any, loc: tuple) -> tuple:
    """``loc`` without the union tags pydantic puts in it (``executor.slurm.allocation``: the file writes
    ``executor.allocation``): a part the mapping lacks as a key but holds as a value (``platform:
    slurm``), the discriminator pydantic chose the model by. ``tree``: the YAML node graph, or the data."""
    kept: list = []
    for i, part in enumerate(loc):
        branches = _branches(tree)
        if isinstance(branches, dict):
            values = {_scalar(v) for v in branches.values()}
            if part not in branches and part in values and i + 1 < len(loc):
                continue  # a tag: the field sits directly in this mapping
            tree = branches.get(part)
        elif isinstance(branches, list) and isinstance(part, int) and part < len(branches):
            tree = branches[part]
        else:
            tree = None
        kept.append(part)
    return tuple(kept)


def _branches(tree: Any) -> dict | list | None:
    """A mapping's children by key, or a sequence's, of a YAML node or of data; None for a scalar."""
    if isinstance(tree, yaml.MappingNode):
        return {k.value: v for k, v in tree.value if isinstance(k, yaml.ScalarNode)}  # the last key wins
    if isinstance(tree, yaml.SequenceNode):
        return tree.value
    return tree if isinstance(tree, dict | list) else None


def _scalar(value: Any) -> str | None:
    """A scalar's text (of a YAML node or of data), None for anything else."""
    value = value.value if isinstance(value, yaml.ScalarNode) else value
    return value if isinstance(value, str) else None


def _entry_prefix(entry: str | None) -> str:
    """What every message about a ``datasets`` entry's config starts with (empty for the file's own)."""
    return f"dataset {entry}: " if entry else ""


def _config_error(exc: ValidationError, node: yaml.Node, path: Path, entry: str | None) -> ConfigError:
    """One ConfigError listing every problem pydantic found, each with line, field and value."""
    problems = []
    first_line = None
    for err in exc.errors():
        loc = tuple(err["loc"])
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, FieldError):  # a cross-field check naming its field
            loc += cause.loc
        loc = _without_tags(node, loc)  # after: a tag last in pydantic's loc is followed by the field's
        named_by = tag_field(err.get("ctx", {}))
        if err["type"] == "union_tag_invalid" and named_by.isidentifier():
            loc += (named_by,)  # the field that names the kind (a database's name, the platform)
        line = _line_in(node, loc, entry)
        first_line = first_line or line
        value = err.get("input")
        hidden = err["type"] == "missing" or isinstance(value, dict) or isinstance(cause, SecretValueError)
        # a refused secret is not printed back; the variable it came from is
        facts = ([] if hidden else [f"got {value!r}"]) + [
            f"written as {written}" for written in [_written_with_variables(node, loc, entry)] if written
        ]
        shown = f" ({', '.join(facts)})" if facts else ""
        where = f"line {line}: " if line else ""
        # A check's own words, without pydantic's "Value error, " before them.
        message = str(cause) if err["type"] == "value_error" and cause is not None else err["msg"]
        if err["type"] == "extra_forbidden":  # not pydantic's "Extra inputs are not permitted": the one meant
            message = unknown_field_message(RunConfig, tuple(err["loc"]))
        elif err["type"] == "union_tag_invalid":  # a misspelt database, platform, chunker... name
            message = unknown_tag_message(err.get("ctx", {}))
        problems.append((where, f"{dotted_path(loc)}: {message}{shown}"))
    if len(problems) == 1:  # as every other config error reads: file:line: field: what is wrong
        return ConfigError(f"{_entry_prefix(entry)}{problems[0][1]}", file=str(path), line=first_line)
    listed = "\n  ".join(where + problem for where, problem in problems)
    message = f"{_entry_prefix(entry)}invalid configuration:\n  {listed}"
    return ConfigError(message, file=str(path), line=first_line)
