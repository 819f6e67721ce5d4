"""The labels of sweep points: each point's unique name in the report, and the file name it becomes.

An entry's label is its ``label`` (or its database's name) followed by the values swept in it:
``milvus[index_type=ivf_pq,hnsw_m=32]``. The label names the point's link in the stage directory and its
figure files, so two labels that would become one file name are refused like a label used twice.
"""

from __future__ import annotations

import re
from typing import Any


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
