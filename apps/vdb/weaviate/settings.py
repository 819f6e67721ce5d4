"""The weaviate settings users write under ``vdb.databases`` (pydantic only: no client library)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from executors.safe import EnvName, PlainText, ServerUrl, with_port


def _plain_http(url: str) -> str:
    if not url.lower().startswith("http://"):  # an https URL would be polled and queried over http
        raise ValueError("must be http://host:port: the client reaches an attached node without TLS")
    return url


# A running node to attach to: http only, reached anonymously (apps/vdb/weaviate/client.py); its port named,
# as HTTP's default is 80 and Weaviate's 8080.
NodeUrl = Annotated[ServerUrl, AfterValidator(_plain_http), AfterValidator(with_port)]


class WeaviateSettings(BaseModel):
    """How to run (or reach) Weaviate; embedded in the YAML config under ``vdb.databases``."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["weaviate"] = "weaviate"
    binary: str | None = Field(
        None, description="weaviate-server path; default $WEAVIATE_BIN, <repo>/.build/bin, then PATH"
    )
    nodes: int = Field(1, ge=1, description="Processes to start: 1 = single node, N > 1 = local cluster")
    url: NodeUrl | None = Field(
        None, description="http:// URL of a running node (reached without a key): attach instead of starting"
    )
    grpc_port: int = Field(50051, description="gRPC port of the node at `url`")
    async_indexing: bool = Field(True, description="ASYNC_INDEXING: index from a queue (needed by dynamic)")
    gomaxprocs: int | None = Field(None, ge=1, description="GOMAXPROCS per node (cores a node may use)")
    raft_timeouts_multiplier: int = Field(
        1,
        ge=1,
        description="RAFT_TIMEOUTS_MULTIPLIER: 1 suits loopback (starts in ~3 s); Weaviate's default is 5",
    )
    env: dict[EnvName, PlainText] = Field(
        default_factory=dict,
        description="Extra environment for every node (on HPC written quoted into the ranks' env files: "
        "$ is literal)",
    )
    startup_timeout: float | None = Field(
        None, gt=0, description="Seconds to wait for health (None: caller's)"
    )
    insert_request_size: int = Field(1000, ge=1, description="Objects per gRPC batch request")
    search_threads: int = Field(8, ge=1, description="Parallel single-query requests in a search batch")
    request_timeout: float = Field(120.0, gt=0, description="Timeout of one query or schema request, seconds")
    insert_timeout: float = Field(300.0, gt=0, description="Timeout of one batch insert request, seconds")


def index_problems(settings: WeaviateSettings, collection: Any, cluster: Any) -> list[tuple[str, str]]:
    """Weaviate's PQ has at most 256 centroids per segment; dynamic needs async indexing."""
    problems = []
    if collection.quantization == "pq" and collection.pq_bits > 8:
        problems.append(
            ("pq_bits", f"{collection.pq_bits}: Weaviate's PQ has at most 256 centroids (8 bits)")
        )
    if collection.index_type == "dynamic" and not settings.async_indexing:
        problems.append(("index_type", "'dynamic' needs async_indexing: true (ASYNC_INDEXING)"))
    return problems


def with_threads(settings: WeaviateSettings, threads: int) -> WeaviateSettings:
    """GOMAXPROCS per node = ``threads`` (Go does not follow CPU affinity), unless ``gomaxprocs`` is set."""
    return settings.model_copy(update={"gomaxprocs": settings.gomaxprocs or threads})


def local_ranks(settings: WeaviateSettings) -> int:
    """The server processes a local deployment of ``settings`` starts (``nodes``: a local cluster)."""
    return settings.nodes
