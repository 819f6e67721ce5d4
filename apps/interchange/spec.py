"""How a run names a dataset it does not generate: one already in the store, or files to import first."""

from __future__ import annotations

from pydantic import Field, field_validator

from apps.interchange.formats import canonical_format
from core.config import Strict
from core.errors import InputDataError


class ImportSpec(Strict):
    """Files in one of the ANN community's formats, imported as the run's first stage (``dataset import``)."""

    format: str = Field(
        description="hdf5, vecs (fvecs/bvecs), bin (fbin/u8bin/i8bin), npy or vdbbench (docs/datasets.md)."
    )
    paths: list[str] = Field(
        min_length=1,
        description="Base, queries and ground-truth files in that order, or one folder (one .hdf5 file); "
        "relative to the config file.",
    )
    rows_per_part: int = Field(1_000_000, ge=1, description="Base rows per Parquet part file.")

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        try:
            return canonical_format(value)
        except InputDataError as exc:
            raise ValueError(str(exc)) from None
