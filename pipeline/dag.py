"""Runs a plan as one Parsl DAG: shard -> chunk -> embed -> dataset, queries, ground truth.

Each stage is a Parsl app; per-shard chains (chunk i -> embed i) are linked by futures, so embedding of
shard 0 starts while shard 1 is still being chunked. Complete stages are not submitted at all, and
complete shards inside a partial stage return at once, which is what makes ``run`` resumable.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from parsl import python_app
from parsl.dataflow.errors import PropagatedException
from rich.console import Console

from apps.dataset import chunking as chunk_stage
from apps.dataset import corpus as corpus_stage
from apps.dataset import layout as dataset_stage
from apps.dataset import queries as queries_stage
from apps.dataset.embedding import stage as embed_stage
from apps.dataset.embedding.model import EmbeddingConfig
from apps.dataset.geometry import stage as geometry_stage
from apps.dataset.groundtruth import stage as gt_stage
from apps.dataset.groundtruth.stage import GroundTruthConfig
from apps.dataset.queries import QueriesConfig
from apps.interchange import published
from core.errors import ArtifactError, PipelineError
from core.lifetime import Terminated
from core.store import atomic_write_json, ensure_writable_dir, os_error_reason, read_manifest
from executors.jobs import BlockJobRecorder
from executors.labels import DRIVER, WORKERS
from executors.lifecycle import load_parsl, shut_down_parsl
from executors.platforms import cpu_label, parsl_config_for
from pipeline.plan_model import Plan, StagePlan
from pipeline.progress import StageProgress
from pipeline.provenance import Provenance

log = logging.getLogger(__name__)


# --- thin wrappers: a future's value (a shard record) becomes the next stage's input ---------------------


def embed_chunk_shard(record: dict[str, Any], chunks_dir: str, *args: Any) -> dict[str, Any]:
    """``embed_shard`` over the chunk file a chunk task wrote (``record`` is that task's result)."""
    return embed_stage.embed_shard(str(Path(chunks_dir) / record["file"]), record["shard"], *args)


def finalize_chunks(out_dir: str, key: str, upstream: list[str], *records: dict[str, Any]) -> dict[str, Any]:
    manifest = {
        "stage": "chunk",
        "version": chunk_stage.STAGE_VERSION,
        "key": key,
        "upstream_keys": upstream,
        "chunks": sum(r["rows"] for r in records),
        "documents": sum(r["documents"] for r in records),
        "files": sorted(
            ({k: v for k, v in r.items() if k != "cached"} for r in records), key=lambda r: r["shard"]
        ),
    }
    atomic_write_json(Path(out_dir) / "manifest.json", manifest)
    return manifest


def finalize_dataset(
    dataset_dir: str, key: str, metadata: dict, extra: dict, *records: dict
) -> dict[str, Any]:
    return dataset_stage.finalize_dataset(dataset_dir, key, list(records), metadata, extra)


def build_queries_after_dataset(
    out_dir: str,
    queries: QueriesConfig,
    embedding: EmbeddingConfig,
    terms: str | None,
    chunk_files: list[str],
    fraction: float,
    dataset: dict,
    *_chunk_records: dict,
) -> dict[str, Any]:
    """The queries stage once the dataset is final (they are embedded in its precision) and, for held-out
    queries, once the chunks they are read from are written (a cached dataset does not wait for them)."""
    precision = dataset.get("precision")
    return queries_stage.build_queries(out_dir, queries, embedding, terms, chunk_files, fraction, precision)


def groundtruth_after_dataset(
    out_dir: str,
    dataset_dir: str,
    queries_file: str,
    groundtruth: GroundTruthConfig,
    dataset: dict,
    queries: dict,
) -> dict[str, Any]:
    """The ground truth once both are final; queries and dataset of different precisions are refused.

    The queries stage refuses to write them in another precision, but queries cached from an earlier run
    (their key does not hold the effective precision, known only on the worker) meet the dataset here.
    """
    made, asked = dataset.get("precision"), queries.get("precision")
    if made and asked and made != asked:
        raise ArtifactError(
            f"the queries in {Path(queries_file).parent} were computed in {asked}, the dataset in {made}: "
            "queries and dataset must share one precision; delete that folder and rerun where the dataset "
            "was made, or set embedding.dtype: float32"
        )
    return gt_stage.compute_groundtruth(out_dir, dataset_dir, queries_file, groundtruth)


def import_given(
    fmt: str,
    paths: list[str],
    name: str,
    store: str,
    metric: str,
    rows_per_part: int,
    row_group_rows: int,
    memory_budget_mb: int,
    planned_dir: str,
) -> dict[str, Any]:
    """The import stage (``dataset.imported``): the files into the planned dataset folder; its manifest.

    The folder is named by the files' content: landing elsewhere means they changed after the plan."""
    from apps.interchange.importer import import_dataset

    result = import_dataset(
        fmt, paths, name, Path(store), metric, rows_per_part, row_group_rows, memory_budget_mb
    )
    if str(result.directory) != planned_dir:
        raise ArtifactError(
            f"the files of dataset.imported changed after the plan: imported into {result.directory}, "
            f"planned {planned_dir}; run again"
        )
    return {**result.manifest, "cached": result.cached}


def chunk_label(config: Any) -> str:
    """The executor chunking runs on.

    Semantic chunking embeds sentence windows with the embedding model, so it runs where the model runs:
    the GPU workers, one device each (on the CPU block every worker would load the model onto GPU 0 of its
    node). Chunking without a model (none, recursive) needs only the tokenizer and runs on the CPU block.
    """
    return WORKERS if config.chunking.method == "semantic" else cpu_label(config.executor)


class DagRunner:
    """Submits the stages of a plan to Parsl and records them in provenance."""

    def __init__(self, plan: Plan, provenance: Provenance, console: Console) -> None:
        self.plan = plan
        self.provenance = provenance
        self.console = console
        cfg = plan.config
        self.embedding = plan.embedding  # typed models cross Parsl (they pickle): no dead field hides
        self._noted: set[str] = set()  # console notes already printed (export made, precisions seen)
        cpu = cpu_label(cfg.executor)
        self.apps = {
            "shard": python_app(corpus_stage.shard_corpus, executors=[cpu]),
            "chunk": python_app(chunk_stage.chunk_shard, executors=[chunk_label(cfg)]),
            "embed": python_app(embed_chunk_shard, executors=[WORKERS]),
            "queries": python_app(build_queries_after_dataset, executors=[WORKERS]),
            "groundtruth": python_app(groundtruth_after_dataset, executors=[WORKERS]),
            "geometry": python_app(geometry_stage.compute_geometry, executors=[cpu]),
            "finalize_chunks": python_app(finalize_chunks, executors=[DRIVER]),
            "finalize_dataset": python_app(finalize_dataset, executors=[DRIVER]),
            "import": python_app(import_given, executors=[cpu]),
            # A given dataset's truth: its published lists cut to k (driver threads), or exact search (GPU)
            "published_groundtruth": python_app(published.run_groundtruth, executors=[DRIVER]),
            "given_groundtruth": python_app(published.run_groundtruth, executors=[WORKERS]),
        }

    def _track(
        self, stage: str, future: Future, progress: StageProgress, items_field: str = "rows"
    ) -> Future:
        def done(f: Future) -> None:
            if f.exception() is None:
                record = f.result()
                self.provenance.task_finished(stage, record)
                reused = bool(record.get("cached"))
                # A reused shard's record tells of its first run's export: not news to this run. Said
                # before the bar moves: "exported the model" comes before "embed: 1/8 done".
                openvino = self.embedding is not None and self.embedding.backend == "openvino"
                if stage == "embed" and openvino and not reused:
                    self._say(*embed_stage.shard_notices(record, self.embedding, self._noted))
                progress.advance(stage, int(record.get(items_field, 0) or 0), reused=reused)

        future.add_done_callback(done)
        return future

    def _clock_after(self, name: str, progress: StageProgress, *inputs: Future, first: bool = False) -> None:
        """Start ``name``'s clock (its provenance ``started``, its rate) once ``inputs`` are all done (with
        ``first``: once one is, for a stage whose tasks stream from them): until then its tasks wait, and
        that wait is the upstream stages' time, not its own."""

        def start() -> None:
            self.provenance.stages[name]["started"] = time.time()
            progress.inputs_ready(name)

        pending = [f for f in inputs if not f.done()]
        if first and len(pending) < len(inputs):
            start()  # one input is there already: the stage can start now
            return
        left, lock = [1 if first else len(pending)], threading.Lock()

        def one_done(_: Future) -> None:
            with lock:
                left[0] -= 1
                if left[0]:  # with first: negative after the first, which alone starts the clock
                    return
            start()

        for future in pending:
            future.add_done_callback(one_done)

    def _say(self, *lines: str) -> None:
        """Console lines a user should see (worker logs never reach the console), kept in pipeline.log too.
        Text, not rich markup: a path or a point's label may hold brackets."""
        for line in lines:
            self.console.print(line, highlight=False, markup=False)
            log.info(line)

    def _start(self, name: str) -> bool:
        stage = self.plan.stage(name)
        cached = stage.complete
        self.provenance.stage_started(name, stage.key, stage.directory, stage.upstream, cached)
        return cached

    def run(self) -> dict[str, str]:
        """Execute every incomplete stage; return the output directories by stage."""
        plan, cfg = self.plan, self.plan.config
        with StageProgress(self.console) as progress:
            if cfg.generates_dataset:
                self._generate(progress)
            else:
                self._take_dataset(progress)

            if "geometry" in plan.stages:  # after the dataset, queries and ground truth: the report shows it
                self._geometry(progress)

            # 4. vector databases: deploy -> insert -> index -> query -> teardown, then the report.
            if cfg.vdb and not self._start("vdb"):
                from pipeline.vdb_stages import VdbStages

                report = VdbStages(plan, self.provenance, progress).run()
                self.provenance.stage_finished("vdb", {"files": report["files"]})
            elif cfg.vdb:
                self.provenance.stage_finished("vdb", read_manifest(plan.stage("vdb").directory))
        return {name: str(stage.directory) for name, stage in plan.stages.items()}

    def _generate(self, progress: StageProgress) -> None:
        """Shard, chunk, embed -> the dataset; then its queries and ground truth."""
        plan, cfg = self.plan, self.plan.config
        docs, chunks, embed = plan.stage("shard"), plan.stage("chunk"), plan.stage("embed")
        # 1. shard: one sequential streaming pass (deterministic shard plan).
        if self._start("shard"):
            docs_manifest = read_manifest(docs.directory)
        else:
            progress.add_stage("shard", 1)
            future = self.apps["shard"](
                [str(p) for p in plan.corpus_files],
                cfg.corpus,
                cfg.sharding,
                str(docs.directory),
            )
            self._track("shard", future, progress, "documents")
            docs_manifest = future.result()
        self.provenance.stage_finished("shard", docs_manifest)
        doc_files = [str(docs.directory / f["file"]) for f in docs_manifest["files"]]
        chunk_files = [str(chunks.directory / f"chunks-{i:05d}.parquet") for i in range(len(doc_files))]

        # 2. chunk i -> embed i, per shard, linked by futures.
        chunk_cached = self._start("chunk")
        embed_cached = self._start("embed")
        if not chunk_cached:
            progress.add_stage("chunk", len(doc_files))
        if not embed_cached:
            progress.add_stage("embed", len(doc_files))
            if self.embedding.backend == "openvino":  # the first shard waits for the export: say so
                self._say(embed_stage.export_notice(self.embedding))
        chunk_futures: list[Future] = []
        embed_futures: list[Future] = []
        for index, doc_file in enumerate(doc_files):
            if chunk_cached:
                chunk_future: Future = Future()
                chunk_future.set_result(read_manifest(chunks.directory)["files"][index])
            else:
                chunk_future = self._track(
                    "chunk",
                    self.apps["chunk"](
                        doc_file,
                        str(chunks.directory),
                        index,
                        cfg.chunking,
                        str(plan.tokenizer_dir),
                        self.embedding,
                    ),
                    progress,
                )
            chunk_futures.append(chunk_future)
            if not embed_cached:
                embed_futures.append(
                    self._track(
                        "embed",
                        self.apps["embed"](
                            chunk_future,
                            str(chunks.directory),
                            str(embed.directory),
                            self.embedding,
                            plan.file_metadata,
                            cfg.dataset.holdout_fraction,
                            cfg.dataset.row_group_rows,
                        ),
                        progress,
                    )
                )
        if not embed_cached:  # its shards stream from the chunking: its clock starts with the first one
            self._clock_after("embed", progress, *chunk_futures, first=True)
        chunks_done = (
            self.apps["finalize_chunks"](str(chunks.directory), chunks.key, chunks.upstream, *chunk_futures)
            if not chunk_cached
            else None
        )
        if embed_cached:
            dataset_future: Future = Future()
            dataset_future.set_result(read_manifest(embed.directory))
        else:
            dataset_future = self.apps["finalize_dataset"](
                str(embed.directory),
                embed.key,
                plan.file_metadata,
                {"chunks_key": chunks.key, "upstream_keys": embed.upstream},
                *embed_futures,
            )

        # 3. queries (after the dataset: they share its precision) and ground truth (after both).
        queries_future = gt_future = None
        if cfg.queries:
            queries, gt = plan.stage("queries"), plan.stage("groundtruth")
            if not self._start("queries"):
                progress.add_stage("queries", 1)
                waits = chunk_futures if cfg.queries.source == "holdout" else []
                self._clock_after("queries", progress, dataset_future, *waits)
                queries_future = self._track(
                    "queries",
                    self.apps["queries"](
                        str(queries.directory),
                        cfg.queries,
                        self.embedding,
                        str(plan.terms_file) if plan.terms_file else None,
                        chunk_files,
                        cfg.dataset.holdout_fraction,
                        dataset_future,  # the dataset's precision
                        *waits,
                    ),
                    progress,
                    "count",
                )
            else:
                queries_future = Future()
                queries_future.set_result(read_manifest(queries.directory))
            if not self._start("groundtruth"):
                progress.add_stage("groundtruth", 1)
                self._clock_after("groundtruth", progress, dataset_future, queries_future)
                gt_future = self._track(
                    "groundtruth",
                    self.apps["groundtruth"](
                        str(gt.directory),
                        str(embed.directory),
                        str(queries.directory / "queries.parquet"),
                        cfg.groundtruth,
                        dataset_future,
                        queries_future,
                    ),
                    progress,
                    "queries",
                )

        # Wait in dependency order so the first failure is the one reported.
        if chunks_done is not None:
            self.provenance.stage_finished("chunk", chunks_done.result())
        else:
            self.provenance.stage_finished("chunk", read_manifest(chunks.directory))
        self.provenance.stage_finished("embed", dataset_future.result())
        if queries_future is not None:
            self.provenance.stage_finished("queries", queries_future.result())
        if gt_future is not None:
            self.provenance.stage_finished("groundtruth", gt_future.result())
        elif cfg.queries:
            self.provenance.stage_finished("groundtruth", read_manifest(plan.stage("groundtruth").directory))

    def _take_dataset(self, progress: StageProgress) -> None:
        """A given dataset: import it (``dataset.imported``) or take it as stored; then the ground truth."""
        plan, cfg = self.plan, self.plan.config
        dataset, gt = plan.stage("embed"), plan.stage("groundtruth")
        if self._start("embed"):
            manifest = read_manifest(dataset.directory)
        else:  # only an import is ever incomplete: a stored dataset is refused at plan unless complete
            spec = cfg.dataset.imported
            progress.add_stage("embed", 1)
            future = self.apps["import"](
                spec.format,
                [str(cfg.resolve_path(p, plan.loaded.base_dir)) for p in spec.paths],
                cfg.dataset.name,
                str(plan.store),
                cfg.groundtruth.metric,
                spec.rows_per_part,
                cfg.dataset.row_group_rows,
                cfg.groundtruth.memory_budget_mb,
                str(dataset.directory),
            )
            manifest = self._track("embed", future, progress).result()
            self._say(*(f"warning: dataset import: {line}" for line in manifest.get("warnings", [])))
        self.provenance.stage_finished("embed", manifest)
        self._start("queries")  # the dataset's own: complete with it
        self.provenance.stage_finished("queries", manifest["queries"])
        if self._start("groundtruth"):
            truth = read_manifest(gt.directory)
        else:
            progress.add_stage("groundtruth", 1)
            usable = published.unusable_reason(manifest, cfg.groundtruth) is None
            future = self.apps["published_groundtruth" if usable else "given_groundtruth"](
                str(gt.directory),
                str(dataset.directory),
                str(plan.stage("queries").directory / "queries.parquet"),
                cfg.groundtruth,
            )
            truth = self._track("groundtruth", future, progress, "queries").result()
            if truth.get("published_unused"):
                self._say(f"ground truth computed by exact search: {truth['published_unused']}")
        self.provenance.stage_finished("groundtruth", truth)

    def _geometry(self, progress: StageProgress) -> None:
        """The geometry stage on the CPU block (see apps/dataset/geometry/stage.py), unless complete."""
        plan, cfg = self.plan, self.plan.config
        stage = plan.stage("geometry")
        if self._start("geometry"):
            self.provenance.stage_finished("geometry", read_manifest(stage.directory))
            return
        progress.add_stage("geometry", 1)
        # A generated dataset has queries when the config asks for them; a given one brings its own.
        files = {
            name: str(plan.stage(name).directory / f"{name}.parquet") if name in plan.stages else None
            for name in ("queries", "groundtruth")
        }
        future = self.apps["geometry"](
            str(stage.directory),
            str(plan.stage("embed").directory),
            files["queries"],
            files["groundtruth"],
            cfg.groundtruth.metric,
            cfg.geometry,
        )
        self.provenance.stage_finished("geometry", self._track("geometry", future, progress).result())


def preflight(plan: Plan) -> None:
    """Before any worker starts: refuse output directories we cannot write (a foreign ``dataset.dir`` was
    refused by the plan).

    An unwritable store would otherwise fail inside a task, as an OSError per shard wrapped in Parsl's
    dependency errors; here it is one ConfigError naming the config line to change.
    """
    for name, stage in plan.stages.items():
        if stage.complete:
            continue
        if name in ("embed", "queries") and not plan.config.generates_dataset:
            stage = StagePlan(name, stage.key, stage.directory.parent, {})  # the import renames into it
        field = ("dataset", "dir") if name == "embed" and plan.config.dataset.dir else ("workdir",)
        try:
            ensure_writable_dir(stage.directory)
        except OSError as exc:
            reason = os_error_reason(exc, stage.directory)
            raise plan.loaded.error_at(
                field, f"cannot write the {name} stage's output to {stage.directory}: {reason}"
            ) from None


def root_cause(exc: BaseException) -> BaseException:
    """The task error behind Parsl's dependency/join wrappers (a PipelineError first, when there is one).

    A failed chunk task surfaces in the driver as a DependencyError of the stage waiting on it, whose
    message is a page of Parsl text; the user needs the chunk task's own one-line error.
    """
    leaves: list[BaseException] = []

    def collect(error: BaseException) -> None:
        if isinstance(error, PropagatedException):
            for inner, _tid in error.dependent_exceptions_tids:
                collect(inner)
        else:
            leaves.append(error)

    collect(exc)
    return next((e for e in leaves if isinstance(e, PipelineError)), leaves[0] if leaves else exc)


def execute(plan: Plan, provenance: Provenance, console: Console) -> dict[str, str]:
    """Load the platform's Parsl config, run the DAG, and always shut Parsl down."""
    preflight(plan)
    executor, split = plan.config.executor, None
    from executors.allocation import current_split, in_one_allocation

    if in_one_allocation(executor):  # the run is its own batch job
        split = current_split(executor, plan.config.vdb)
    parsl_config = parsl_config_for(
        executor,
        provenance.run_dir,
        plan.config.monitoring,
        split=split,
        gpu_on_demand=plan.config.gpu_on_demand,
    )
    dfk = load_parsl(parsl_config)
    try:
        with BlockJobRecorder(list(dfk.executors.values())):  # a killed driver's jobs: the next run cancels
            return DagRunner(plan, provenance, console).run()
    except PropagatedException as exc:
        raise root_cause(exc) from None
    finally:
        if split is not None:  # one allocation: the blocks end as a job's steps do, cleaning up after them
            from executors.allocation import end_steps

            end_steps()
        shut_down_parsl(dfk, terminated=isinstance(sys.exc_info()[1], Terminated))
