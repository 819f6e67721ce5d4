"""The qdrant settings users write under ``vdb.databases`` (pydantic only: no client library)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from executors.safe import EnvName, check_server_url

# A running server's URL, or ':memory:' (qdrant-client's local mode, for tests).
QdrantLocation = Annotated[str, AfterValidator(lambda v: v if v == ":memory:" else check_server_url(v))]


class QdrantSettings(BaseModel):
    """Everything a user can set for Qdrant under ``vdb.databases``."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["qdrant"] = "qdrant"
    mode: Literal["edge", "server"] = Field(
        "edge", description="edge: in-process qdrant-edge-py; server: qdrant-client"
    )
    url: QdrantLocation | None = Field(
        None, description="server: existing server URL (http://host:6333), or ':memory:'"
    )
    local_path: str | None = Field(None, description="server: qdrant-client local mode on disk (tests only)")
    binary: str = Field("qdrant", description="server: qdrant executable to start when no url is set")
    prefer_grpc: bool = Field(True, description="server: upload and query over gRPC")
    grpc_port: int = Field(6334, description="server: gRPC port of the server given by url")
    api_key_env: EnvName | None = Field(None, description="server: environment variable holding the API key")
    timeout_s: int = Field(120, description="server: timeout of one request, seconds")
    request_points: int = Field(256, ge=1, description="server: points per upsert request (size limit)")
    wait_for_writes: bool = Field(True, description="server: upsert waits until the batch is applied")
    indexing_threshold_kb: int = Field(10000, ge=1, description="segments larger than this get HNSW (KB)")
    full_scan_threshold_kb: int = Field(
        10000, ge=1, description="segments smaller than this are scanned (KB)"
    )
    default_segment_number: int = Field(0, ge=0, description="target segment count (0: one per CPU)")
    max_segment_size_kb: int | None = Field(None, description="largest segment the optimizer builds (KB)")
    max_indexing_threads: int = Field(0, ge=0, description="threads per HNSW build (0: auto)")
    edge_search_threads: int | None = Field(None, description="edge: search thread pool size (None: CPUs)")
    poll_s: float = Field(0.5, gt=0, description="server: status polling interval, seconds")
    settle_polls: int = Field(2, ge=1, description="server: consecutive idle polls that mean steady state")


def index_problems(settings: QdrantSettings, collection: Any, cluster: Any) -> list[tuple[str, str]]:
    """Qdrant's product quantiser has 8-bit codes (256 centroids per sub-vector)."""
    if collection.quantization == "pq" and collection.pq_bits != 8:
        return [("pq_bits", f"{collection.pq_bits}: Qdrant's product quantiser uses 8-bit codes; set 8")]
    return []


def with_threads(settings: QdrantSettings, threads: int) -> QdrantSettings:
    """Qdrant's own thread knobs = ``threads``: its search threads (edge: ``edge_search_threads``; a server:
    QDRANT__STORAGE__PERFORMANCE__MAX_SEARCH_THREADS) and HNSW build threads (``max_indexing_threads``),
    each unless set."""
    return settings.model_copy(
        update={
            "edge_search_threads": settings.edge_search_threads or threads,
            "max_indexing_threads": settings.max_indexing_threads or threads,
        }
    )
