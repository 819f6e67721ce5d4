"""The LanceDB settings users write under ``vdb.databases`` (pydantic only: no client library)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Medium = Literal["run_dir", "memory", "ssd", "local_disk", "lustre", "daos"]


class LanceDBSettings(BaseModel):
    """Everything a user can set for LanceDB (embedded: it runs inside the client process)."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["lancedb"] = "lancedb"
    medium: Medium = Field(
        "run_dir",
        description="What data_path is on, recorded with the results (run_dir: the run's own data "
        "directory; memory: data_path defaults to /dev/shm; ssd, local_disk, lustre, daos: data_path "
        "required).",
    )
    data_path: str | None = Field(
        None,
        description="Directory the tables are written under (a per-run subdirectory is made in it); "
        "None: the run's data directory (medium run_dir) or /dev/shm (medium memory). Must be reachable from "
        "the client node(s): LanceDB runs there.",
    )
    nprobes: int = Field(
        20, ge=1, description="IVF lists probed: always for ivf_hnsw_sq; ivf_flat, ivf_pq: when ef is None."
    )
    refine_factor: int | None = Field(
        None, ge=1, description="Re-rank refine_factor x k candidates on the full vectors (None: no refine)."
    )
    sample_rate: int = Field(
        256, ge=2, description="k-means training rows per IVF list (LanceDB trains at most rows/sample_rate)."
    )
    max_iterations: int = Field(50, ge=1, description="k-means iterations of the IVF (and PQ) training.")
    compact_before_index: bool = Field(
        True,
        description="build_index first compacts the upload's fragments and deletes superseded versions "
        "(counted in index time; disk bytes then exclude rows replaced by retried upserts).",
    )
    poll_s: float = Field(0.2, gt=0, description="Polling interval while waiting for rows, seconds.")

    @model_validator(mode="after")
    def _path_for_medium(self) -> LanceDBSettings:
        if self.medium not in ("run_dir", "memory") and not self.data_path:
            raise ValueError(f"medium {self.medium!r} needs data_path (the directory on that medium)")
        return self
