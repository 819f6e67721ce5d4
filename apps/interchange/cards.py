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
SUBSET = re.compile(r"-\d+[kmb]")  # a prefix by its row count: -10m, -500k (not -512: maybe a dimension)


@dataclass(frozen=True)
class Card:
    """What a remote dataset's card says of its vectors."""

    name: str
    dims: int
    path: Path


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
            return Card(card["name"], card["dims"], path)
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
