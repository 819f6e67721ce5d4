"""The milvus settings users write under ``vdb.databases`` (pydantic only: no client library)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from executors.safe import EnvName, PlainText, check_server_url

# An existing server: pymilvus takes tcp:// beside http(s)://.
MilvusUri = Annotated[str, AfterValidator(lambda v: check_server_url(v, ("http", "https", "tcp")))]
# A dotted milvus.yaml key (dataCoord.segment.maxSize).
DottedKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")]


class MilvusSettings(BaseModel):
    """How to run (or reach) Milvus; embedded in the run config under ``vdb.databases``."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["milvus"] = "milvus"
    uri: MilvusUri | None = Field(
        None, description="Existing Milvus to use (http://host:19530); none is started."
    )
    token_env: EnvName | None = Field(
        None,
        description="uri: environment variable holding the server's credentials ('user:password' or a "
        "token; a value here would be written into the run's provenance)",
    )
    data_dir: str | None = Field(
        None, description="Data dir of an existing server, for describe()'s disk bytes."
    )
    binary: str | None = Field(None, description="Milvus executable; default: the PyPI package 'milvus' one.")
    binary_cache_dir: str | None = Field(
        None, description="Where the packaged binary is unpacked once (default ~/.cache/pes2o-vdb)."
    )
    host: str = Field("127.0.0.1", description="Address components advertise (2.3 binds all interfaces).")
    port: int | None = Field(None, description="Client (proxy) port; None picks a free one.")
    start_attempts: int = Field(3, ge=1, description="Starts tried with fresh ports if a port got taken.")
    stop_grace: float = Field(10.0, ge=0, description="SIGTERM to SIGKILL seconds (> gracefulStopTimeout 5).")
    min_segment_rows_to_index: int = Field(
        1024,
        ge=0,
        description="Smaller segments get no index and are scanned (Milvus default 1024); lower it for "
        "small samples so that the configured index is what gets measured.",
    )
    config_overrides: dict[DottedKey, str | int | float | bool] = Field(
        default_factory=dict, description="Dotted milvus.yaml keys, e.g. {'dataCoord.segment.maxSize': 512}."
    )
    env: dict[EnvName, PlainText] = Field(
        default_factory=dict,
        description="Extra server environment, e.g. GOMAXPROCS (on HPC written quoted into the ranks' env "
        "files: $ is literal).",
    )
    insert_mode: Literal["upsert", "insert"] = Field(
        "upsert",
        description="'upsert' makes retried batches idempotent; 'insert' may duplicate them. Into an empty "
        "collection the first attempt of each batch is a plain insert either way.",
    )
    consistency_level: Literal["Strong", "Bounded", "Session", "Eventually"] = Field(
        "Bounded", description="Consistency level of searches (counts are always Strong)."
    )
    default_ef: int = Field(64, ge=1, description="HNSW ef when a search gives none (raised to k if lower).")
    default_nprobe: int = Field(16, ge=1, description="IVF nprobe when a search gives none (ef is nprobe).")
    request_timeout: float = Field(120.0, gt=0, description="Timeout of one client request, in seconds.")

    @model_validator(mode="before")
    @classmethod
    def _token_became_token_env(cls, data: Any) -> Any:
        """Runs recorded before ``token_env`` hold ``token: ''`` (dropped, so their reports re-render); a
        value is refused without being echoed: it is a credential."""
        if isinstance(data, dict) and "token" in data:
            if data["token"]:
                raise ValueError(
                    "token was replaced by token_env: put the credentials in an environment variable and "
                    "name the variable there"
                )
            data = {key: value for key, value in data.items() if key != "token"}
        return data


# Why the local server cannot build DISKANN: the PyPI package's knowhere has no DiskANN (the index build
# fails with 'C Runtime Exception: bad_function_call' and is retried for ever).
NO_DISKANN = (
    "the PyPI `milvus` 2.3.5 server (local, or vdb.cluster.runtime: native) is built without DiskANN; "
    "use the milvusdb/milvus image (vdb.cluster with runtime: apptainer) or an existing server (uri)"
)


def index_problems(settings: MilvusSettings, collection: Any, cluster: Any) -> list[tuple[str, str]]:
    """DISKANN only where the server has it: an existing server (``uri``) or the Milvus image on HPC, whose
    query nodes must load disk indexes (``queryNode.enableDisk``, false in milvus.yaml by default)."""
    if collection.index_type != "diskann" or settings.uri:
        return []
    runtime = cluster.for_database("milvus").runtime if cluster is not None else None
    if runtime != "apptainer":
        return [("index_type", f"'diskann': {NO_DISKANN}")]
    if settings.config_overrides.get("queryNode.enableDisk") is not True:
        return [
            (
                "index_type",
                "'diskann' on the Milvus image needs config_overrides: {queryNode.enableDisk: true}",
            )
        ]
    return []


def with_threads(settings: MilvusSettings, threads: int) -> MilvusSettings:
    """GOMAXPROCS = ``threads`` in the server's environment (Go does not follow CPU affinity), unless the
    ``env`` setting gives one."""
    return settings.model_copy(update={"env": {"GOMAXPROCS": str(threads), **settings.env}})
