"""The dataset cards in ``datasets/`` (one YAML file per dataset), read for what an import can check.

A remote dataset's dimension is its own: files imported under its name (``gist-1m``), or under a
subset's (its name and a row count with its unit: ``yandex-t2i-10m``), must have it. An environment
variable pointing at the wrong folder is refused before gigabytes are read, instead of making a dataset
that bears the study's name and not its data. Any other name (``gist-1m-pca128``, ``dbpedia-openai-1m-512``,
``my-gist``) is the user's own: not checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

_ROOT = Path(__file__).resolve().parents[2]
# The repository's cards; an installed wheel has none (its parents[2] is site-packages, whose `datasets` is
# Hugging Face's package): nothing is checked there.
CARDS = _ROOT / "datasets" if (_ROOT / "pyproject.toml").is_file() else None
SUBSET = re.compile(r"-[1-9]\d*[kmb]")  # a prefix by its row count: -10m, -500k (not -512: maybe a dimension)


@dataclass(frozen=True)
class Card:
    """What a remote dataset's card says of its vectors."""

    name: str
    dims: int
    path: Path
    vectors: int | None = None  # its base rows, where the card gives them


def _read_card(path: Path) -> dict:
    """A card's fields; empty when it is not a YAML mapping (a user's draft: not this check's business,
    and the shipped cards are validated by tests/test_datasets_folder.py)."""
    try:
        card = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return card if isinstance(card, dict) else {}


def remote_card(name: str, folder: Path | None = CARDS) -> Card | None:
    """The card of the remote dataset ``name`` is, or is a subset of (case aside); None when none."""
    if folder is None:
        return None
    wanted = name.lower()
    for path in sorted(folder.glob("*.yaml")):
        card = _read_card(path)
        own = str(card.get("name", "")).lower()
        if card.get("kind") != "remote" or not own or not isinstance(card.get("dims"), int):
            continue
        if wanted == own or (wanted.startswith(own) and SUBSET.fullmatch(wanted[len(own) :])):
            vectors = card.get("vectors") if isinstance(card.get("vectors"), int) else None
            return Card(card["name"], card["dims"], path, vectors)
    return None


def card_problem(name: str, dim: int, where: str) -> str | None:
    """Why vectors of ``dim`` from ``where`` cannot be dataset ``name``; None when its card agrees."""
    card = remote_card(name)
    if card is None or card.dims == dim:
        return None
    whose = f"{card.name}'s card" if name.lower() == card.name.lower() else (
        f"{name!r} names a subset of {card.name}, whose card"
    )  # fmt: skip
    return (
        f"{where}: {dim}-dimensional vectors, but {whose} (datasets/{card.path.name}) gives {card.dims} "
        f"dimensions: are these {card.name}'s files? (else give the dataset another name)"
    )


UNITS = {"k": 10**3, "m": 10**6, "b": 10**9}
ROWS_TOLERANCE = 0.02  # dbpedia-openai-1m's HDF5 split holds 990,000 of its 1M (the rest are its queries)


def card_rows_note(name: str, rows: int, where: str) -> str | None:
    """A warning when ``rows`` base vectors under ``name`` are not what its card gives (or its subset's
    name: ``-10m``, 10,000,000), beyond ``ROWS_TOLERANCE``: a part of a dataset under the whole one's name
    makes every figure look like the study's. Not refused: the vectors are the dataset's own."""
    card = remote_card(name)
    if card is None:
        return None
    suffix = name.lower()[len(card.name) :]
    expected = int(suffix[1:-1]) * UNITS[suffix[-1]] if suffix else card.vectors
    if expected is None or _near(rows, expected):
        return None
    whose = f"{card.name}'s card (datasets/{card.path.name})"
    if card.vectors is not None and rows > card.vectors and not _near(rows, card.vectors):
        return f"{where}: {rows:,} base vectors, more than {whose} gives ({card.vectors:,}): another dataset?"
    named = whose if not suffix else f"its name {name!r}"
    whole = card.vectors is not None and _near(rows, card.vectors)
    return (
        f"{where}: {rows:,} base vectors, but {named} gives {expected:,}: a part or another set under its "
        f"name? (name it by what it holds, e.g. {card.name if whole else _subset_name(card.name, rows)})"
    )


def _near(rows: int, expected: int) -> bool:
    return abs(rows - expected) <= ROWS_TOLERANCE * expected


def _subset_name(dataset: str, rows: int) -> str:
    """``gist-1m`` of 2,000 rows -> ``gist-1m-2k``: the row count as a subset's name writes it (a name
    the checks read back as that count); ``gist-1m-sample`` where no count of a unit is near."""
    for unit, size in sorted(UNITS.items(), key=lambda item: -item[1]):
        if rows >= size and _near(rows, round(rows / size) * size):
            return f"{dataset}-{round(rows / size)}{unit}"
    return f"{dataset}-sample"
