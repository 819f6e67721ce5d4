"""YAML parsing that refuses what a configuration never needs: duplicate keys, alias bombs, deep nesting.

PyYAML keeps the last of two equal keys, shares aliased nodes (so ``*a`` ten times per level expands
×10 per level once the data is walked), and composes recursively (deep nesting ends in RecursionError).
:class:`GuardedLoader` checks all three while composing, before anything walks the data, and every
error names the file, the line and the field path.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from core.errors import ConfigError

MAX_DEPTH = 32  # a run configuration nests about 6 levels
MAX_VALUES = 100_000  # values after alias expansion; a configuration holds a few hundred
_MERGE_TAG = "tag:yaml.org,2002:merge"
# What YAML refuses to read (yaml.reader.Reader.NON_PRINTABLE).
_NON_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


class _Refused(Exception):
    """A structure the guard refuses: field path, message and the 1-based line."""

    def __init__(self, where: tuple, message: str, line: int) -> None:
        super().__init__(message)
        self.where, self.message, self.line = where, message, line


def dotted_path(where: tuple) -> str:
    """A field's path as a config file writes it: ``vdb.databases.0.engine``."""
    return ".".join(str(p) for p in where) or "<top level>"


class GuardedLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, nesting beyond MAX_DEPTH and expansion beyond MAX_VALUES."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._where: list[Any] = []
        self._sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values when expanded, height)

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        """Track the field path and depth; measure each finished node (aliases reuse the measure)."""
        part = index.value if isinstance(index, ScalarNode) else index
        pushed = parent is not None and part is not None
        if pushed:
            self._where.append(part)
        try:
            if self.check_event(AliasEvent):
                event = self.peek_event()
                node = super().compose_node(parent, index)
                if id(node) not in self._sizes:
                    raise _Refused(
                        tuple(self._where),
                        f"alias *{event.anchor} refers to a node containing it",
                        event.start_mark.line + 1,
                    )
                self._check(node, event.start_mark.line + 1)
                return node
            if len(self._where) > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise _Refused(
                    tuple(self._where[:MAX_DEPTH]), f"nested more than {MAX_DEPTH} levels deep", line
                )
            node = super().compose_node(parent, index)
            if isinstance(node, MappingNode):
                self._refuse_duplicates(node)
            self._sizes[id(node)] = self._measure(node)
            self._check(node, node.start_mark.line + 1)
            return node
        finally:
            if pushed:
                self._where.pop()

    def _measure(self, node: Node) -> tuple[int, int]:
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        measures = [self._sizes[id(child)] for child in children]
        return 1 + sum(m[0] for m in measures), 1 + max((m[1] for m in measures), default=0)

    def _check(self, node: Node, line: int) -> None:
        values, height = self._sizes[id(node)]
        where = tuple(self._where)
        if values > MAX_VALUES:
            raise _Refused(
                where,
                f"expands to more than {MAX_VALUES:,} values (YAML aliases repeated inside aliases?)",
                line,
            )
        if len(where) + height > MAX_DEPTH + 1:
            raise _Refused(where, f"nested more than {MAX_DEPTH} levels deep (through aliases)", line)

    def _refuse_duplicates(self, node: MappingNode) -> None:
        seen: dict[tuple[str, str], Node] = {}
        for key, _ in node.value:
            if not isinstance(key, ScalarNode) or key.tag == _MERGE_TAG:  # a merge may be overridden
                continue
            first = seen.setdefault((key.tag, key.value), key)
            if first is not key:
                lines = first.start_mark.line + 1, key.start_mark.line + 1
                raise _Refused(
                    (*self._where, key.value),
                    f"duplicate key {key.value!r} on lines {lines[0]} and {lines[1]} "
                    "(YAML would keep only the last)",
                    lines[1],
                )


def _line_at(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _where_at(node: Node | None, index: int, where: tuple = ()) -> tuple:
    """Field path of the deepest node whose text span holds character ``index``."""
    if isinstance(node, MappingNode):
        for key, value in node.value:
            if key.start_mark.index <= index < max(value.end_mark.index, key.end_mark.index + 1):
                return _where_at(value, index, (*where, key.value))
    elif isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            if item.start_mark.index <= index <= item.end_mark.index:
                return _where_at(item, index, (*where, i))
    return where


def _compose(text: str) -> tuple[Node | None, Any]:
    loader = GuardedLoader(text)
    try:
        node = loader.get_single_node()
        return node, (loader.construct_document(node) if node is not None else None)
    finally:
        loader.dispose()


def parse_yaml(text: str, path: Path) -> tuple[Node | None, Any]:
    """The node graph and the data of ``text``; ConfigError naming file, line and field otherwise."""
    bad = _NON_PRINTABLE.search(text)
    if bad is not None:  # YAML refuses the whole text; find the field on a copy with the byte blanked
        line = _line_at(text, bad.start())
        try:
            node, _ = _compose(_NON_PRINTABLE.sub(" ", text))
            where = dotted_path(_where_at(node, bad.start()))
        except (yaml.YAMLError, _Refused):
            where = "<unknown field>"
        code = ord(bad.group())
        raise ConfigError(
            f"{where}: control character U+{code:04X} in the text (write it as an escape in a quoted string "
            "if it is meant)",
            file=str(path),
            line=line,
        )
    try:
        return _compose(text)
    except _Refused as exc:
        raise ConfigError(f"{dotted_path(exc.where)}: {exc.message}", file=str(path), line=exc.line) from None
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else None
        raise ConfigError(f"malformed YAML: {exc.problem}", file=str(path), line=line) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"malformed YAML: {exc}", file=str(path)) from None
