"""The plan of a run: every stage's content key, directory and whether it is already complete.

The records (:class:`Plan`, :class:`StagePlan`) live in :mod:`pipeline.plan_model`; this module
plans a generated dataset, and hands a given one to :mod:`pipeline.given_dataset`.

Keys depend only on the configuration, the input files' identity and upstream keys, never on outputs,
so the whole plan is known before anything runs: ``plan`` prints it, ``run`` skips what is complete.
Changing only the model changes the keys of embed, queries and ground truth but not of shard and chunk.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from apps.dataset import chunking as chunk_stage
from apps.dataset import corpus as corpus_stage
from apps.dataset import layout as dataset_stage
from apps.dataset import queries as queries_stage
from apps.dataset.embedding.loading import (
    end_token_problem,
    load_tokenizer,
    max_input_tokens,
    model_digest,
    model_digest_dir,
    pools_last_token,
    resolve_model_path,
    tokenizer_fingerprint,
)
from apps.dataset.embedding.model import TRANSFORMERS_RECIPE, format_query
from apps.dataset.geometry import stage as geometry_stage
from apps.dataset.groundtruth import stage as gt_stage
from core.errors import ConfigError, InputDataError
from core.store import complete_manifest, content_key, sha256_file, uncreatable_reason
from pipeline.config.loader import LoadedConfig
from pipeline.plan_model import (
    Plan,
    StagePlan,
    add_evaluation_stages,
    beyond_expected_rows,
    check_dimension,
    check_rows,
    geometry_params,
)
from pipeline.resources import resource_plan
from pipeline.sweep import PointPlan

__all__ = ["Plan", "StagePlan", "build_plan", "model_slug", "native_dimension"]

# Embedding fields that change the vectors. Batching knobs change them too in reduced precision (bf16
# kernels round differently per batch shape: up to ~1e-3 in cosine), not in float32 (below 1e-6).
BATCHING_FIELDS = ("token_budget", "max_batch_size")
VECTOR_FIELDS = (
    "backend",
    "max_length",
    "dtype",
    "pooling",
    "normalize",
    "dimension",
    "attn_implementation",
    "output_dtype",
)


def native_dimension(model_dir: Path) -> int:
    """Output dimension of a model directory (sentence-transformers modules first, then config.json)."""
    dense = sorted(model_dir.glob("*_Dense/config.json"))
    if dense:
        return int(json.loads(dense[-1].read_text())["out_features"])
    pooling = sorted(model_dir.glob("*_Pooling/config.json"))
    if pooling:  # sentence-transformers < 6 wrote word_embedding_dimension, 6 writes embedding_dimension
        settings = json.loads(pooling[0].read_text())
        return int(settings.get("embedding_dimension") or settings["word_embedding_dimension"])
    config = json.loads((model_dir / "config.json").read_text())
    return int(config["hidden_size"])


def _check_model_limits(loaded: LoadedConfig, model_dir: Path) -> int:
    """The output dimension. ConfigErrors: max_length or an MRL dimension beyond what the model has, and
    last-token pooling over a tokenizer that appends no end token."""
    emb = loaded.config.embedding
    native = native_dimension(model_dir)
    if emb.dimension and emb.dimension > native:
        raise loaded.error_at(
            ("embedding", "dimension"),
            f"{emb.dimension} exceeds the model's {native} dimensions (Matryoshka truncation only shortens)",
        )
    limit = max_input_tokens(model_dir)
    if limit is not None and emb.max_length > limit[0]:
        raise loaded.error_at(
            ("embedding", "max_length"),
            f"{emb.max_length} exceeds the model's limit of {limit[0]} tokens ({limit[1]} in {model_dir})",
        )
    # A directory without tokenizer files (a test's stand-in) is left to the embed stage to refuse.
    has_tokenizer = any((model_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))
    if has_tokenizer and pools_last_token(emb.backend, emb.pooling, model_dir):
        # The recipe's pooling field for the transformers backend; the model's own modules otherwise.
        field = ("embedding", "pooling" if emb.backend == "transformers" else "model")
        try:
            problem = end_token_problem(load_tokenizer(str(model_dir)))
        except Exception as exc:  # whatever transformers raises for a broken tokenizer
            raise loaded.error_at(
                ("embedding", "model"), f"cannot load the tokenizer of {model_dir}: {exc}"
            ) from None
        if problem:
            raise loaded.error_at(field, f"last-token pooling of {model_dir}: {problem}")
    return emb.dimension or native


def model_slug(model_id: str, model_dir: Path) -> str:
    """A short readable name for directory names (``Qwen3-Embedding-4B``)."""
    name = (model_id or model_dir.name).split("/")[-1]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)[:48] or "model"


def build_plan(loaded: LoadedConfig) -> Plan:
    """Resolve inputs and compute every stage's key and directory; raise ConfigError for bad paths."""
    cfg = loaded.config
    base = loaded.base_dir
    workdir, store = cfg.workdir_path, cfg.store_dir
    for folder in (store, cfg.runs_dir):  # what `run` would find first, told before it starts
        if (reason := uncreatable_reason(folder)) is not None:
            raise loaded.error_at(("workdir",), f"cannot create {folder.name}/ under {workdir}: {reason}")
    if not cfg.generates_dataset:
        from pipeline.given_dataset import build_given_plan

        return build_given_plan(loaded, store)

    try:
        files = corpus_stage.expand_paths(
            cfg.corpus.paths, base, corpus_stage.CORPUS_SUFFIXES[cfg.corpus.format]
        )
    except InputDataError as exc:
        raise loaded.error_at(("corpus", "paths"), str(exc)) from None
    try:
        model_dir = resolve_model_path(cfg.embedding.model, base)
    except InputDataError as exc:
        raise loaded.error_at(("embedding", "model"), str(exc)) from None
    tokenizer_spec = cfg.chunking.tokenizer
    try:
        tokenizer_dir = resolve_model_path(tokenizer_spec, base) if tokenizer_spec else model_dir
    except InputDataError as exc:
        raise loaded.error_at(("chunking", "tokenizer"), str(exc)) from None
    terms_file = None
    if cfg.queries and cfg.queries.source == "terms":
        terms_file = cfg.resolve_path(cfg.queries.terms_file, base)
        if not terms_file.is_file():
            what = "is a directory, not a file" if terms_file.is_dir() else "does not exist"
            raise loaded.error_at(("queries", "terms_file"), f"term list {terms_file} {what}")
        try:
            queries_stage.read_terms(terms_file, limit=1)  # reads up to the first term only
        except InputDataError as exc:
            raise loaded.error_at(("queries", "terms_file"), f"{exc} (no term in it)") from None

    embedding = cfg.embedding.model_dump()
    dimension = _check_model_limits(loaded, model_dir)
    check_dimension(loaded, dimension)
    model_identity = {
        "model_id": cfg.embedding.model_id,
        "revision": cfg.embedding.revision,
        "fingerprint": model_digest(model_dir, model_digest_dir(workdir))[:16],
    }
    vector_params = {**{k: embedding[k] for k in VECTOR_FIELDS}, "model": model_identity}
    if cfg.embedding.backend == "transformers":  # the recipe is this project's code: its version counts
        vector_params["recipe"] = TRANSFORMERS_RECIPE
    if cfg.embedding.dtype != "float32":
        vector_params["batching"] = {k: embedding[k] for k in BATCHING_FIELDS}

    stages: dict[str, StagePlan] = {}
    points: list[PointPlan] = []

    def add(
        name: str, version: str, params: dict[str, Any], upstream: list[str], directory: Path | None = None
    ):
        key = content_key(name, version, params, upstream)
        stages[name] = StagePlan(name, key, directory or store / name / key, params, upstream)
        return stages[name]

    corpus_params = cfg.corpus.model_dump(exclude={"paths"})
    docs = add(
        "shard",
        corpus_stage.STAGE_VERSION,
        {
            "corpus": corpus_params,
            "files": corpus_stage.file_fingerprints(files),
            "sharding": cfg.sharding.model_dump(),
        },
        [],
    )
    chunk_params: dict[str, Any] = {
        "chunking": cfg.chunking.model_dump(exclude={"tokenizer"}),
        "tokenizer": tokenizer_fingerprint(str(tokenizer_dir)),
    }
    if cfg.chunking.method == "semantic":  # breakpoints come from the model's embeddings
        chunk_params["vectors"] = vector_params
    chunks = add("chunk", chunk_stage.STAGE_VERSION, chunk_params, [docs.key])

    dataset_params = {"vectors": vector_params, "holdout_fraction": cfg.dataset.holdout_fraction}
    dataset_key = content_key("embed", dataset_stage.STAGE_VERSION, dataset_params, [chunks.key])
    if cfg.dataset.dir:
        dataset_dir = cfg.resolve_path(cfg.dataset.dir, Path.cwd())
    else:
        dataset_dir = (
            store
            / "datasets"
            / f"{cfg.dataset.name}-{model_slug(cfg.embedding.model_id, model_dir)}-{dataset_key}"
        )
    # A foreign or other dataset.dir is refused here, so that `plan` says it and `run` before it writes
    # anything; even when "complete": a manifest.json of someone else's without a key would pass for ours.
    dataset_stage.check_dataset_dir(dataset_dir, dataset_key, dimension)
    embed = add("embed", dataset_stage.STAGE_VERSION, dataset_params, [chunks.key], dataset_dir)
    made = complete_manifest(dataset_dir) if embed.complete else None
    rows = made["rows"] if made else cfg.dataset.expected_rows  # for the resource plan
    if cfg.queries and made:  # the row count is known: a k above it would be cut silently
        check_rows(loaded, made.get("rows"), dataset_dir)

    if cfg.queries:
        query_params: dict[str, Any] = {
            **cfg.queries.model_dump(exclude={"terms_file"}),
            "vectors": vector_params,
            "task": cfg.embedding.query_task if cfg.queries.instruction else None,
        }
        upstream: list[str] = []
        if terms_file is not None:
            query_params["terms_sha256"] = sha256_file(terms_file)
        else:
            query_params["holdout_fraction"] = cfg.dataset.holdout_fraction
            upstream = [chunks.key]
        queries = add("queries", queries_stage.STAGE_VERSION, query_params, upstream)
        gt_params = cfg.groundtruth.model_dump(include={"k", "metric"})
        gt = add("groundtruth", gt_stage.STAGE_VERSION, gt_params, [dataset_key, queries.key])
        points = add_evaluation_stages(cfg, store, add, [dataset_key, queries.key, gt.key])
    elif cfg.geometry.enabled:
        add("geometry", geometry_stage.STAGE_VERSION, geometry_params(cfg), [dataset_key])

    query_count = None  # for the resource plan: what the queries stage will make, where it is known
    if terms_file is not None:
        try:
            query_count = len(queries_stage.read_terms(terms_file, limit=cfg.queries.limit))
        except InputDataError as exc:
            raise loaded.error_at(("queries", "terms_file"), str(exc)) from None
    file_metadata = {
        "dataset_name": cfg.dataset.name,
        "dataset_key": dataset_key,
        "model": cfg.embedding.model,
        "model_id": cfg.embedding.model_id,
        "revision": cfg.embedding.revision,
        "model_fingerprint": model_identity["fingerprint"],
        "backend": cfg.embedding.backend,
        **({"recipe": TRANSFORMERS_RECIPE} if cfg.embedding.backend == "transformers" else {}),
        "dimension": dimension,
        "dtype": cfg.embedding.dtype,
        "output_dtype": cfg.embedding.output_dtype,
        "pooling": "model" if cfg.embedding.backend != "transformers" else cfg.embedding.pooling,
        "normalize": cfg.embedding.normalize,
        "max_length": cfg.embedding.max_length,
        "document_instruction": None,
        "query_instruction": (
            format_query("{text}", cfg.embedding.query_task)  # the format the queries are embedded with
            if cfg.queries and cfg.queries.instruction
            else None
        ),
        "chunking": cfg.chunking.model_dump(),
        "tokenizer_fingerprint": chunk_params["tokenizer"],
    }
    if not files:
        raise ConfigError("no corpus files", file=str(loaded.shown_path))
    from pipeline.hpc_plan import check_or_raise

    check_or_raise(loaded)  # platform rules: queue limits, images, storage media (a no-op locally)
    # Workers get the directory resolved here: they run elsewhere (another cwd, another node), so
    # resolving the config's spelling again there could load another model or none.
    export_dir = cfg.embedding.export_dir or store.parent / "cache" / "embed-models"
    resolved = cfg.embedding.model_copy(
        update={"model": str(model_dir), "export_dir": str(cfg.resolve_path(str(export_dir), base))}
    )
    resources = resource_plan(
        loaded,
        [p.point for p in points],
        rows,
        dimension,
        query_count,
        pending=[p.point for p in points if not p.complete],
        truth_done="groundtruth" not in stages or not stages["groundtruth"].to_run,
    )
    if not made:  # only the config's estimate of the rows: its checks wait for the dataset, so warn now
        resources.warnings += beyond_expected_rows(loaded, rows)
    return Plan(
        loaded,
        store,
        files,
        model_dir,
        tokenizer_dir,
        dimension,
        stages,
        file_metadata,
        terms_file,
        resolved,
        points,
        resources,
    )
