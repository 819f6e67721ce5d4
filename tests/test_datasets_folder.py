"""``datasets/``: data only (cards and bundled samples), never the module ``import datasets`` finds.

A folder without ``__init__.py`` on ``sys.path`` imports as an empty namespace package; run from the
repository root (``python -m pipeline``, whose ``sys.path[0]`` is the current directory) it would shadow
Hugging Face ``datasets`` and break libraries that probe for it (LanceDB). The project depends on that
package, and a regular package wins over a namespace folder wherever each sits on ``sys.path``.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from apps.interchange.formats import IMPORT_FORMATS
from tests.conftest import REPO, SAMPLE, TERMS

FOLDER = REPO / "datasets"
CARDS = sorted(FOLDER.glob("*.yaml"))
# The study's datasets (Ockerman et al. 2026, Table I) and the bundled samples: each must have a card.
EXPECTED = {"pes2o-ve", "gist-1m", "dbpedia-openai-1m", "yandex-t2i", "pes2o-sample", "bvbrc-roles"}


class CardFile(BaseModel):
    """One file of a dataset: bundled (``path`` under datasets/) or remote (``url``)."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = None
    url: str | None = None
    rows: int | None = Field(None, ge=0)
    bytes: int | None = Field(None, ge=0)
    sha256: str | None = Field(..., pattern=r"^[0-9a-f]{64}$")  # required key; null only for remote files

    @model_validator(mode="after")
    def _one_place(self) -> CardFile:
        if (self.path is None) == (self.url is None):
            raise ValueError("a file has exactly one of path (bundled) and url (remote)")
        if self.path is not None and (self.sha256 is None or self.bytes is None):
            raise ValueError(f"{self.path}: a bundled file records its sha256 and bytes")
        return self


class DatasetCard(BaseModel):
    """A dataset card (datasets/*.yaml): where the data comes from, what it is, and how it gets here."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    kind: Literal["bundled", "remote", "built"]
    description: str
    source: str
    paper: str
    format: str
    licence: str
    files: list[CardFile] = Field(min_length=1)
    published: str | None = None
    model: str | None = None
    dims: int | None = Field(None, gt=0)
    metric: Literal["l2", "ip", "cosine"] | None = None
    vectors: int | None = Field(None, gt=0)
    documents: int | None = Field(None, gt=0)
    queries: int | None = Field(None, gt=0)
    groundtruth_k: int | None = Field(None, gt=0)
    # How it becomes a dataset of this project: imported, built by a run, or exported.
    import_: str | None = Field(None, alias="import")
    produce: str | None = None
    export: str | None = None
    # Changes to how it is made, newest first (each one changes the content key of what a run builds).
    changelog: list[str] = []

    @model_validator(mode="after")
    def _complete(self) -> DatasetCard:
        if self.kind != "bundled" and not (self.dims and self.metric and self.vectors and self.queries):
            raise ValueError(f"{self.name}: a study dataset's card gives dims, metric, vectors and queries")
        if self.kind == "remote" and not self.import_:
            raise ValueError(f"{self.name}: a remote dataset's card says which import command brings it in")
        if self.kind == "built" and not self.produce:
            raise ValueError(f"{self.name}: a built dataset's card says which run produces it")
        return self


def _load(path: Path) -> DatasetCard:
    return DatasetCard.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def test_import_datasets_from_the_repository_root_is_hugging_face() -> None:
    """Run from the root with the project's Python (``''`` first on sys.path), ``import datasets`` is the
    installed package, not this folder."""
    script = (
        "import sys, datasets; "
        "assert sys.path[0] == '', sys.path[:2]; "
        "print(datasets.__file__); print(list(getattr(datasets, '__path__', [])))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    module_file, search_path = result.stdout.splitlines()[-2:]
    assert module_file != "None", "datasets imported as a namespace package (the repository's folder)"
    location = Path(module_file).resolve()
    assert "site-packages" in location.parts, location
    assert not location.is_relative_to(FOLDER.resolve()), location
    assert str(FOLDER) not in search_path and str(FOLDER.resolve()) not in search_path, search_path


def test_the_folder_holds_data_only() -> None:
    """No ``__init__.py`` and no Python source anywhere in it: it is not a package."""
    assert FOLDER.is_dir()
    assert not (FOLDER / "__init__.py").exists()
    code = [p.relative_to(FOLDER) for p in FOLDER.rglob("*") if p.suffix in {".py", ".pyc", ".pyi", ".so"}]
    assert code == []


def test_every_dataset_has_a_card() -> None:
    names = [_load(path).name for path in CARDS]
    assert len(names) == len(set(names)), names
    assert set(names) >= EXPECTED
    for path in CARDS:
        assert path.stem == _load(path).name, f"{path.name}: the file is named after the card"


@pytest.mark.parametrize("card_path", CARDS, ids=[p.stem for p in CARDS])
def test_card_loads_and_its_bundled_files_match(card_path: Path) -> None:
    """Each card validates; each bundled file exists with the recorded size and sha256; each remote file's
    checksum is either a sha256 or null (recorded at first download), never anything else."""
    card = _load(card_path)
    for entry in card.files:
        if entry.path is None:
            assert entry.url and re.match(r"^(https?|ftp)://", entry.url), entry.url
            continue
        path = FOLDER / entry.path
        assert path.is_file(), f"{card_path.name}: {entry.path} is missing"
        assert path.stat().st_size == entry.bytes, f"{entry.path}: size"
        assert _sha256(path) == entry.sha256, f"{entry.path}: sha256"
    if card.import_:
        words = card.import_.split()
        assert words[:5] == ["python", "-m", "pipeline", "dataset", "import"], card.import_
        assert words[5] in IMPORT_FORMATS and "--name" in words, card.import_


def test_every_bundled_file_is_on_a_card() -> None:
    """Nothing lands in datasets/ without provenance: a card names each data file, with its sha256."""
    carded = {entry.path for path in CARDS for entry in _load(path).files if entry.path}
    data = {
        p.relative_to(FOLDER).as_posix()
        for p in FOLDER.rglob("*")
        if p.is_file() and p.suffix != ".yaml" and p.name != "README.md"
    }
    assert data == carded
    assert {SAMPLE.relative_to(FOLDER).as_posix(), TERMS.relative_to(FOLDER).as_posix()} <= carded
