"""The run configuration (pydantic v2): one model assembled from the models next to the code they configure.

The YAML file maps one-to-one onto :class:`RunConfig`; :mod:`pipeline.config.loader` reads it, interpolates
``${ENV}`` values and turns validation errors into messages naming the file, line, field and value.
``docs/configuration.md`` is generated from these models, so every field carries a description.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from apps.dataset.chunking import ChunkingConfig, NoChunking, RecursiveChunking, SemanticChunking
from apps.dataset.corpus import CorpusConfig, ShardingConfig
from apps.dataset.embedding.model import QWEN3_QUERY_TASK, EmbeddingConfig
from apps.dataset.geometry.estimates import GeometryConfig
from apps.dataset.groundtruth.stage import GroundTruthConfig
from apps.dataset.layout import DatasetConfig
from apps.dataset.queries import QueriesConfig
from apps.interchange.spec import ImportSpec
from apps.vdb.config import CollectionConfig, InsertConfig, QuerySweepConfig, VdbConfig
from core.config import FieldError, Strict
from core.store import SAFE_NAME
from executors.config import ExecutorConfig, LocalExecutorConfig

__all__ = [
    "QWEN3_QUERY_TASK",
    "ChunkingConfig",
    "CollectionConfig",
    "CorpusConfig",
    "DatasetConfig",
    "EmbeddingConfig",
    "GeometryConfig",
    "GroundTruthConfig",
    "ImportSpec",
    "InsertConfig",
    "LocalExecutorConfig",
    "NoChunking",
    "QueriesConfig",
    "QuerySweepConfig",
    "RecursiveChunking",
    "RunConfig",
    "RunDatasetConfig",
    "SemanticChunking",
    "ShardingConfig",
    "Strict",
    "VdbConfig",
]


class RunDatasetConfig(DatasetConfig):
    """The run's dataset: generated from ``corpus`` with ``embedding`` (the default), or taken as it is."""

    stored: str | None = Field(
        None,
        description="Use a dataset already in the store, with its own queries and ground truth: its name "
        "(a folder <workdir>/store/datasets/<name>-<key>/ made by `dataset import` or by a run's import) "
        "or the path of its folder. corpus, chunking, embedding and queries are then absent.",
    )
    imported: ImportSpec | None = Field(
        None,
        description="Import these files as the run's first stage (as `dataset import` does), then use them "
        "like `stored`. The metric is groundtruth.metric.",
    )

    expected_rows: int | None = Field(
        None,
        ge=1,
        description="Rows the generated dataset will have, for the resource plan before it exists (the full "
        "Pes2o-VE: 88,453,763); `plan` warns of a groundtruth.k or vdb.insert.rows beyond it. Once it is "
        "made, its manifest's count is used. A given dataset (stored, imported) is counted from its files.",
    )

    @property
    def given(self) -> bool:
        """True when the run takes its dataset as it is instead of generating it."""
        return self.stored is not None or self.imported is not None


# Sections that only a generated dataset has; a run given its dataset must leave them out.
GENERATING_SECTIONS = ("corpus", "sharding", "chunking", "embedding", "queries")


def _not_generated(source: str, sections: list[str]) -> str:
    """Why ``sections`` do not belong beside a given dataset (``source``: dataset.stored or imported)."""
    return (
        f"{source} takes the dataset, its queries and ground truth as they are: remove "
        f"{', '.join(sections)} (they describe a dataset the run generates)"
    )


class RunConfig(Strict):
    """One run of the workflow."""

    name: str = Field(pattern=SAFE_NAME, description="Run name, used in run ids.")
    workdir: str = Field(
        ".",
        description="Root for store/ (content-keyed artifacts) and runs/; relative to the current directory.",
    )
    corpus: CorpusConfig | None = Field(
        None, description="The corpus the dataset is made from; absent when dataset.stored or imported."
    )
    sharding: ShardingConfig = Field(default_factory=ShardingConfig)
    chunking: ChunkingConfig = Field(default_factory=NoChunking)
    embedding: EmbeddingConfig | None = Field(
        None, description="The model that embeds the corpus; absent when dataset.stored or imported."
    )
    dataset: RunDatasetConfig = Field(default_factory=RunDatasetConfig)
    queries: QueriesConfig | None = Field(
        None,
        description="Omit to skip queries and ground truth (a stored or imported dataset brings its own).",
    )
    groundtruth: GroundTruthConfig = Field(default_factory=GroundTruthConfig)
    geometry: GeometryConfig = Field(
        default_factory=GeometryConfig,
        description="Intrinsic dimension and relative contrast of the dataset and queries (a sample).",
    )
    executor: ExecutorConfig = Field(default_factory=LocalExecutorConfig)
    monitoring: bool = Field(False, description="Record Parsl's monitoring database in the run directory.")
    vdb: VdbConfig | None = Field(
        None, description="Omit to stop after the dataset, queries and ground truth."
    )

    @model_validator(mode="before")
    @classmethod
    def _given_dataset_is_not_generated(cls, data: Any) -> Any:
        """A corpus or embedding section beside a given dataset, told before its own fields are checked:
        a half-written ``embedding`` would otherwise ask for its missing model, not to be removed."""
        given = data.get("dataset") if isinstance(data, dict) else None
        if isinstance(given, dict):
            source = next((f"dataset.{k}" for k in ("stored", "imported") if given.get(k) is not None), None)
            written = [name for name in ("corpus", "embedding") if data.get(name) is not None]
            if source and written:
                raise FieldError((written[0],), _not_generated(source, written))
        return data

    @model_validator(mode="after")
    def _one_dataset_source(self) -> RunConfig:
        given = self.dataset
        if given.stored is not None and given.imported is not None:
            raise FieldError(
                ("dataset", "imported"), "dataset.stored and dataset.imported both name the dataset: keep one"
            )
        if not given.given:
            missing = [name for name in ("corpus", "embedding") if getattr(self, name) is None]
            if missing:
                raise ValueError(
                    f"{' and '.join(missing)} missing: a run generates its dataset from corpus and "
                    "embedding, unless dataset.stored or dataset.imported names one"
                )
            return self
        source = "dataset.stored" if given.stored is not None else "dataset.imported"
        # By value, not by what was written: a recorded config (rerender) writes every default back.
        defaults = {"sharding": ShardingConfig(), "chunking": NoChunking()}
        extra = [name for name in GENERATING_SECTIONS if getattr(self, name) != defaults.get(name)]
        extra += [
            f"dataset.{name}" for name in ("dir", "holdout_fraction", "expected_rows") if getattr(given, name)
        ]  # a given dataset's rows are read from its files
        if extra:
            raise FieldError(tuple(extra[0].split(".")), _not_generated(source, extra))
        return self

    @property
    def generates_dataset(self) -> bool:
        """True when the run makes its dataset (corpus -> chunks -> embeddings), False when it is given."""
        return not self.dataset.given

    @property
    def gpu_on_demand(self) -> bool:
        """True when the GPU block waits for a task instead of starting with the run: a run that takes its
        dataset embeds nothing, and needs GPUs only for exact ground truth its published lists cannot give."""
        return not self.generates_dataset

    @model_validator(mode="after")
    def _chunks_fit_the_model(self) -> RunConfig:
        # A chunk longer than the model's input is cut when it is embedded: its tail is silently lost.
        size_field = {"recursive": "chunk_size", "semantic": "max_chunk_size"}.get(self.chunking.method)
        if self.embedding is None or size_field is None:
            return self
        size = getattr(self.chunking, size_field)
        if size > self.embedding.max_length:
            raise FieldError(
                ("chunking", size_field),
                f"chunking.{size_field} {size} exceeds embedding.max_length {self.embedding.max_length}: "
                "every longer chunk would be cut where the model's input ends",
            )
        return self

    @model_validator(mode="after")
    def _holdout_queries_need_holdout(self) -> RunConfig:
        if self.queries and self.queries.source == "holdout" and self.dataset.holdout_fraction <= 0:
            raise FieldError(
                ("queries", "source"), "queries.source 'holdout' needs dataset.holdout_fraction > 0"
            )
        return self

    @model_validator(mode="after")
    def _vdb_needs_queries(self) -> RunConfig:
        if self.vdb is None:
            return self
        if self.queries is None and not self.dataset.given:
            raise FieldError(("vdb",), "vdb needs queries (and their ground truth) to measure recall")
        # every point's k: an entry may override vdb.query (apps/vdb/sweep.py)
        for point in self.vdb.points or [None]:
            query = point.config.query if point is not None else self.vdb.query
            if max(query.k) > self.groundtruth.k:
                where = "vdb.query.k" if point is None else f"vdb.query.k of point {point.label!r}"
                loc = ("query", "k") if point is None else self.vdb.written_loc(point, ("query", "k"))
                raise FieldError(
                    ("vdb", *loc), f"{where} {max(query.k)} exceeds groundtruth.k {self.groundtruth.k}"
                )
        names = [
            db.name for db in self.vdb.databases
        ]  # one database twice: distinct labels (apps/vdb/sweep.py)
        unknown = set(self.vdb.optional) - set(names)
        if unknown:
            raise FieldError(
                ("vdb", "optional"), f"vdb.optional names databases not in vdb.databases: {sorted(unknown)}"
            )
        return self

    @property
    def workdir_path(self) -> Path:
        """The workdir, absolute: ``~`` expanded, a relative one taken from the current directory."""
        return Path(self.workdir).expanduser().resolve()

    @property
    def store_dir(self) -> Path:
        """``<workdir>/store``: every stage's outputs, by content key."""
        return self.workdir_path / "store"

    @property
    def runs_dir(self) -> Path:
        """``<workdir>/runs``: one folder per run (provenance, logs, the job scripts of an allocation)."""
        return self.workdir_path / "runs"

    def resolve_path(self, value: str, base: Path) -> Path:
        """A path from the config, relative to ``base`` (the config file's directory) unless absolute."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else (base / path)
