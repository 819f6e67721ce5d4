"""The FAISS settings users write under ``vdb.databases`` (pydantic only: no client library)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class FaissSettings(BaseModel):
    """Everything a user can set for FAISS (the library baseline) under ``vdb.databases``."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["faiss"] = "faiss"
    threads: int = Field(
        0, ge=0, description="OpenMP threads for index builds and searches (0: every CPU of the process)"
    )
    train_rows: int | None = Field(
        None,
        ge=1,
        description="IVF training sample, rows drawn uniformly at random (None: min(rows, 256 x ivf_nlist), "
        "FAISS's own cap per list)",
    )
    train_seed: int = Field(0, description="seed of the IVF training sample")
    add_rows: int = Field(65536, ge=1, description="rows per add() call while building (bounds memory)")
    fsync: bool = Field(
        False,
        description="fsync each stored batch before insert returns (durable across a machine crash, "
        "not only a process crash)",
    )
