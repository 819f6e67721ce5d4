"""The plan's records: every stage's key, directory and completeness, and the helpers both ways of
making a dataset share (:mod:`pipeline.plan` generates it, :mod:`pipeline.given_dataset` is given it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apps.dataset.embedding.model import EmbeddingConfig
from apps.dataset.geometry import stage as geometry_stage
from core.errors import ArtifactError
from core.store import complete_manifest
from pipeline.config.loader import LoadedConfig
from pipeline.config.yaml_guard import dotted_path
from pipeline.sweep import PointPlan, plan_points

BENCHMARK_VERSION = "1"


@dataclass
class StagePlan:
    """One stage: its key, its output directory and whether a verified manifest is already there."""

    name: str
    key: str
    directory: Path
    params: dict[str, Any]
    upstream: list[str] = field(default_factory=list)
    # What the stage is made of, each with its own output (the vdb stage's points): all must be complete.
    parts: list[PointPlan] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when the directory holds this stage's output (same key), every listed file verifies,
        and so does every part (a point lost or damaged since has the stage run again, for that point).

        The key check matters for user-chosen directories (``dataset.dir``), which are not named by key.
        """
        manifest = complete_manifest(self.directory)
        if manifest is None or manifest.get("key", self.key) != self.key:
            return False
        return all(part.complete for part in self.parts)

    @property
    def to_run(self) -> bool:
        """Whether a run will (re)make this stage: incomplete, or its manifest damaged (which ``run``
        names and stops on, and ``plan`` shows)."""
        try:
            return not self.complete
        except ArtifactError:
            return True


@dataclass
class Plan:
    """Everything ``run`` needs, computed without executing a stage."""

    loaded: LoadedConfig
    store: Path
    corpus_files: list[Path]  # empty, and the model fields None, when the run is given its dataset
    model_dir: Path | None
    tokenizer_dir: Path | None
    dimension: int
    stages: dict[str, StagePlan]
    file_metadata: dict[str, Any]
    terms_file: Path | None
    embedding: EmbeddingConfig | None  # the config's embedding, ``model`` resolved once to an absolute path
    points: list[PointPlan] = field(default_factory=list)  # the vdb stage's points (pipeline/sweep.py)
    resources: Any = None  # pipeline.resources.ResourcePlan: every point's estimate against a node
    truth_source: str = ""  # a given dataset: whether its published ground truth serves the run, and why

    @property
    def config(self):
        return self.loaded.config

    def stage(self, name: str) -> StagePlan:
        return self.stages[name]

    @property
    def synthetic_note(self) -> str:
        """:func:`synthetic_note` of the run's dataset (empty unless ``dataset synth`` drew it)."""
        return synthetic_note(self.file_metadata.get("synthetic_like"))

    @property
    def complete(self) -> bool:
        """True when every stage is already complete (a re-run has nothing to do)."""
        return all(stage.complete for stage in self.stages.values())


def synthetic_like(manifest: dict[str, Any]) -> str | None:
    """What a dataset manifest says ``dataset synth`` drew it like (the real dataset's name, else its key,
    else ``a real dataset``); None for real data."""
    synthetic = manifest.get("synthetic")
    if not synthetic:
        return None
    like = synthetic.get("like") or {}
    return like.get("name") or like.get("key") or "a real dataset"


def synthetic_note(like: str | None) -> str:
    """``SYNTHETIC (drawn from a model of <like>; not real data)`` for a dataset ``dataset synth`` drew
    like the real dataset ``like``; empty for real data (None). Synthetic data says so wherever it
    appears: the plan's dataset line, the report's."""
    return f"SYNTHETIC (drawn from a model of {like}; not real data)" if like else ""


def check_rows(loaded: LoadedConfig, rows: Any, dataset_dir: Path | str) -> None:
    """Refuse a ``groundtruth.k`` or an ``insert.rows`` beyond the dataset's ``rows`` (when known): the
    ground truth would be cut to the rows without a word, the insert would load fewer than asked.
    ``dataset_dir``: where the rows are, for the message (an import not yet made: its base file)."""
    cfg = loaded.config
    if not isinstance(rows, int):
        return
    if cfg.groundtruth.k > rows:
        raise loaded.error_at(
            ("groundtruth", "k"),
            f"{cfg.groundtruth.k} neighbours asked of a dataset of {rows} rows ({dataset_dir})",
        )
    for point in cfg.vdb.points if cfg.vdb is not None else []:
        if (asked := point.config.insert.rows) is not None and asked > rows:  # vdb.insert.rows
            raise loaded.error_at(
                ("vdb", *cfg.vdb.written_loc(point, ("insert", "rows"))),
                f"{asked} rows asked of a dataset of {rows} rows ({dataset_dir})",
            )


def beyond_expected_rows(loaded: LoadedConfig, expected: int | None) -> list[str]:
    """Warnings for a ``groundtruth.k`` or an ``insert.rows`` beyond ``dataset.expected_rows`` of a
    dataset still to be made: :func:`check_rows` refuses them once its rows are counted, after embedding;
    the count is the config's estimate, so it warns here instead of refusing."""
    cfg = loaded.config
    if expected is None:
        return []
    words = f"dataset.expected_rows ({expected:,}): refused once the dataset is made, after embedding"
    k = cfg.groundtruth.k
    found = [f"groundtruth.k: {k:,} neighbours are more than {words}"] if k > expected else []
    for point in cfg.vdb.points if cfg.vdb is not None else []:
        if (asked := point.config.insert.rows) is not None and asked > expected:
            field = dotted_path(("vdb", *cfg.vdb.written_loc(point, ("insert", "rows"))))
            found.append(f"{field}: {asked:,} rows (point {point.label!r}) are more than {words}")
    return list(dict.fromkeys(found))


def check_dimension(loaded: LoadedConfig, dimension: int) -> None:
    """Refuse a collection setting the dataset's dimension cannot take, before anything runs: ``ivf_pq``
    cuts each vector into ``pq_m`` sub-vectors of ``dimension / pq_m`` components (FAISS, Milvus and
    LanceDB refuse it only when the index is built, after the upload)."""
    cfg = loaded.config
    for point in cfg.vdb.points if cfg.vdb is not None else []:
        collection = point.config.collection
        if collection.index_type == "ivf_pq" and dimension % collection.pq_m:
            raise loaded.error_at(
                ("vdb", *cfg.vdb.written_loc(point, ("collection", "pq_m"))),
                f"{collection.pq_m} does not divide the dataset's dimension {dimension} (point "
                f"{point.label!r}: ivf_pq cuts each vector into pq_m sub-vectors of equal length)",
            )


def geometry_params(cfg: Any) -> dict[str, Any]:
    """The geometry stage's parameters: its settings and the run's metric."""
    return {**cfg.geometry.model_dump(exclude={"enabled"}), "metric": cfg.groundtruth.metric}


def add_evaluation_stages(
    cfg: Any, store: Path, add: Callable[..., StagePlan], upstream: list[str]
) -> list[PointPlan]:
    """Add geometry and vdb after (dataset, queries, ground truth) = ``upstream``; return the vdb points.

    ``add(name, version, params, upstream)`` records a stage (see :func:`build_plan`)."""
    if cfg.geometry.enabled:  # keyed by the dataset, queries and ground truth (its metric, distances)
        add("geometry", geometry_stage.STAGE_VERSION, geometry_params(cfg), upstream)
    if not cfg.vdb:
        return []
    vdb_params = {**cfg.vdb.model_dump(mode="json"), "metric": cfg.groundtruth.metric}
    stage = add("vdb", BENCHMARK_VERSION, vdb_params, upstream)
    stage.parts = plan_points(cfg.vdb, store, upstream, cfg.groundtruth.metric)
    return stage.parts
