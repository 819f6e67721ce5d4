"""The plan of a run given its dataset (``dataset.stored`` or ``dataset.imported``) instead of generating it.

Such a dataset folder holds its base parts, ``queries.parquet`` and its published ``groundtruth.parquet``
(:mod:`apps.interchange.importer`). The plan's stages keep the roles later stages read: ``embed`` is the
dataset folder (made by the ``import`` task, or already there), ``queries`` is the same folder, and
``groundtruth`` is the run's own folder, filled from the published lists when they serve and by exact
search otherwise (:mod:`apps.interchange.published`). Geometry, vdb and the report follow as for a
generated dataset, keyed by the dataset's content key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apps.dataset.groundtruth import stage as gt_stage
from apps.dataset.layout import dataset_problems, own_files
from apps.interchange.cards import card_problem
from apps.interchange.importer import ImportTarget, cached_import, import_target
from apps.interchange.published import too_few_neighbours, unusable_reason
from core.errors import ArtifactError, InputDataError
from core.store import complete_manifest, content_key, read_manifest
from pipeline.config.loader import LoadedConfig
from pipeline.plan_model import (
    Plan,
    StagePlan,
    add_evaluation_stages,
    check_dimension,
    check_rows,
    synthetic_like,
)
from pipeline.resources import resource_plan

GROUNDTRUTH_FROM_DATASET = "given"  # in the ground-truth key: published-or-exact, not always exact


def stored_candidates(store: Path, name: str, complete: bool = True) -> list[Path]:
    """Dataset folders under ``store/datasets`` named ``name`` (``<name>-<key>`` or ``<name>``): the
    complete ones; with ``complete=False`` those whose manifest names it but whose files do not verify
    (damaged: the caller says so, instead of "no dataset of that name")."""
    found = []
    for folder, manifest in _stored(store):
        if folder.name != name and not folder.name.startswith(f"{name}-"):
            continue
        named = folder.name == name or manifest.get("metadata", {}).get("dataset_name") == name
        if named and (complete_manifest(folder) is not None) == complete:
            found.append(folder)
    return found


def stored_names(store: Path) -> str:
    """What ``store/datasets`` holds, for a message: ``datasets in it: a, b`` (the names a config or
    ``--like`` can give: complete datasets, not a damaged or temporary folder) or ``it holds no dataset``."""
    present = sorted(
        {
            manifest.get("metadata", {}).get("dataset_name") or folder.name
            for folder, manifest in _stored(store)
            if complete_manifest(folder) is not None
        }
    )
    return f"datasets in it: {', '.join(present)}" if present else "it holds no dataset"


def _stored(store: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The folders of ``store/datasets`` with a readable manifest (temporary ones, ``.x``, left out)."""
    root = store / "datasets"
    if not root.is_dir():
        return []
    found = []
    for folder in sorted(root.iterdir()):
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        try:
            manifest = read_manifest(folder)
        except ArtifactError:  # unreadable JSON: not a dataset to offer
            continue
        if isinstance(manifest, dict):
            found.append((folder, manifest))
    return found


def resolve_stored(loaded: LoadedConfig, store: Path) -> Path:
    """The folder ``dataset.stored`` names: a path (relative to the config file) or a name in the store."""
    value = loaded.config.dataset.stored
    assert value is not None
    where = ("dataset", "stored")
    if "/" in value or value.startswith("."):
        folder = loaded.config.resolve_path(value, loaded.base_dir).resolve()  # printed with no `..`
        if not folder.is_dir():
            raise loaded.error_at(where, f"no dataset folder at {folder}")
        return folder
    found = stored_candidates(store, value)
    if not found and (damaged := stored_candidates(store, value, complete=False)):
        return damaged[0]  # refused by _given_manifest, naming the file that does not verify
    if not found:
        raise loaded.error_at(
            where,
            f"no dataset named {value!r} in {store / 'datasets'} ({stored_names(store)}); make one with "
            "`python -m pipeline dataset import`, or name its folder's path",
        )
    if len(found) > 1:
        raise loaded.error_at(
            where,
            f"{len(found)} datasets named {value!r}: {', '.join(p.name for p in found)}; "
            "name one by its path",
        )
    return found[0]


def _given_manifest(loaded: LoadedConfig, folder: Path) -> dict[str, Any]:
    """The manifest of a stored dataset folder, refused unless complete with its queries and ground truth."""
    where = ("dataset", "stored")
    manifest = read_manifest(folder)
    if manifest is None:
        raise loaded.error_at(where, f"{folder} is not a complete dataset (no manifest.json)")
    if len(own_files(manifest)) < 2:
        raise loaded.error_at(
            where,
            f"{folder} holds no queries or ground truth of its own (a dataset a run generated keeps them "
            "in store/queries and store/groundtruth): run the config that made it instead",
        )
    problems = dataset_problems(folder, manifest)
    if problems:
        raise loaded.error_at(where, f"{folder} is damaged: {problems[0]}; remove it and make it again")
    return manifest


def build_given_plan(loaded: LoadedConfig, store: Path) -> Plan:
    """The plan of a run whose dataset is stored or imported; ConfigError naming the field otherwise."""
    cfg = loaded.config
    spec = cfg.dataset
    if spec.imported is not None:
        paths = [cfg.resolve_path(p, loaded.base_dir) for p in spec.imported.paths]
        try:
            target = import_target(
                spec.imported.format,
                paths,
                spec.name,
                store,
                cfg.groundtruth.metric,
                spec.imported.rows_per_part,
                asked_by="groundtruth.metric",
            )
            made = cached_import(target.directory)  # an earlier import of these files: refused when damaged
        except (InputDataError, ArtifactError) as exc:
            raise loaded.error_at(("dataset", "imported", "paths"), str(exc)) from None
        folder, key, producer = target.directory, target.key, "import"
        rows, dimension = target.source.rows, target.source.dim
        source_dtype = target.source.base_dtype
        queries = len(target.source.query_ids)
        params: dict[str, Any] = {"format": target.fmt, "files": target.identity, "metric": target.metric}
        truth = truth_source(cfg.groundtruth, made) if made else _truth_before_import(cfg.groundtruth, target)
    else:
        folder = resolve_stored(loaded, store)
        manifest = _given_manifest(loaded, folder)
        key, producer = str(manifest["key"]), "stored"
        rows, dimension = manifest["rows"], manifest["dimension"]
        source_dtype = (manifest.get("import") or {}).get("source_dtype", "float32")
        queries = manifest["queries"].get("rows")
        params = {"stored": str(folder)}
        truth = truth_source(cfg.groundtruth, manifest)
        if (problem := card_problem(spec.name, manifest["dimension"], str(folder))) is not None:
            raise loaded.error_at(("dataset", "stored"), problem)  # the import checked its own name only
        metric = manifest.get("metric") or manifest["groundtruth"].get("metric")
        if metric != cfg.groundtruth.metric:
            raise loaded.error_at(
                ("groundtruth", "metric"),
                f"{cfg.groundtruth.metric} differs from the dataset's metric {metric} ({folder})",
            )
    # Where the rows are: the folder, or an import's base file while the folder is not made yet.
    check_rows(
        loaded, rows, folder if producer == "stored" or folder.exists() else target.source.where("base")
    )
    check_dimension(loaded, dimension)

    stages: dict[str, StagePlan] = {}

    def add(name: str, version: str, params: dict[str, Any], upstream: list[str]) -> StagePlan:
        stage_key = content_key(name, version, params, upstream)
        stages[name] = StagePlan(name, stage_key, store / name / stage_key, params, upstream)
        return stages[name]

    # The folder's manifest carries ``key``: both roles are complete exactly when it is.
    stages["embed"] = StagePlan(producer, key, folder, params, [])
    stages["queries"] = StagePlan("queries", key, folder, {"from": "dataset"}, [key])
    gt_params = {**cfg.groundtruth.model_dump(include={"k", "metric"}), "from": GROUNDTRUTH_FROM_DATASET}
    gt = add("groundtruth", gt_stage.STAGE_VERSION, gt_params, [key, key])
    points = add_evaluation_stages(cfg, store, add, [key, key, gt.key])
    from pipeline.hpc_plan import check_or_raise

    check_or_raise(loaded)  # platform rules: queue limits, images, storage media (a no-op locally)
    metadata = {"dataset_name": spec.name, "dataset_key": key, "dimension": dimension, "rows": rows}
    metadata["source_dtype"] = source_dtype  # bigann's uint8: stored as float32, as the databases take it
    if producer == "stored" and (like := synthetic_like(manifest)):  # `dataset synth`: say so
        metadata["synthetic_like"] = like
    pending = [p.point for p in points if not p.complete]
    resources = resource_plan(
        loaded, [p.point for p in points], rows, dimension, queries, pending=pending, truth_done=not gt.to_run
    )
    return Plan(
        loaded, store, [], None, None, dimension, stages, metadata, None, None, points, resources,
        truth_source=truth,
    )  # fmt: skip


def truth_source(groundtruth: gt_stage.GroundTruthConfig, manifest: dict[str, Any]) -> str:
    """Where a made dataset's run takes its ground truth from, for ``plan``: the rule of
    :func:`apps.interchange.published.unusable_reason`, as the ground-truth stage applies it."""
    kind = "exact" if (manifest.get("groundtruth") or {}).get("exact") else "published"  # synth: exact
    reason = unusable_reason(manifest, groundtruth)
    if reason is None:
        return f"the dataset's {kind} lists, cut to k={groundtruth.k}"
    return f"exact search: the dataset's {kind} ground truth does not serve ({reason})"


def _truth_before_import(groundtruth: gt_stage.GroundTruthConfig, target: ImportTarget) -> str:
    """:func:`truth_source` of an import not yet made: its agreement with exact search is known only then."""
    published_k = target.source.gt_ids.shape[1] if target.source.gt_ids.ndim == 2 else 0
    if (short := too_few_neighbours(published_k, groundtruth.k)) is not None:
        return f"exact search: the files' published ground truth does not serve ({short})"
    return (
        f"the files' published lists, cut to k={groundtruth.k}, if they agree with exact search when "
        "imported; else exact search"
    )
