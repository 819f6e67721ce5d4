"""The dataset cards in ``datasets/`` (one YAML file per dataset), read for what an import can check.

A remote dataset's dimension is its own: files imported under its name (``gist-1m``), or a subset's
(``yandex-t2i-10m``), must have it. An environment variable pointing at the wrong folder is refused
before gigabytes are read, instead of making a dataset that bears the study's name and not its data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

CARDS = Path(__file__).resolve().parents[2] / "datasets"  # absent from an installed wheel: nothing checked


@dataclass(frozen=True)
class Card:
    """What a remote dataset's card says of its vectors."""

    name: str
    dims: int
    path: Path


def remote_card(name: str, folder: Path = CARDS) -> Card | None:
    """The card of the remote dataset ``name`` is (its name, or its name and a suffix); None when none."""
    for path in sorted(folder.glob("*.yaml")):
        card = yaml.safe_load(path.read_text()) or {}
        own = card.get("name")
        if card.get("kind") == "remote" and own and (name == own or name.startswith(f"{own}-")):
            return Card(own, int(card["dims"]), path)
    return None


def card_problem(name: str, dim: int, where: str) -> str | None:
    """Why vectors of ``dim`` from ``where`` cannot be dataset ``name``; None when its card agrees."""
    card = remote_card(name)
    if card is None or card.dims == dim:
        return None
    return (
        f"{where}: {dim}-dimensional vectors, but {name!r} is {card.name}, whose card ({card.path.name}) "
        f"gives {card.dims} dimensions: are these {card.name}'s files? (or import them under another name)"
    )
