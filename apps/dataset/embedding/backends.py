"""The OpenVINO CPU runtime of the embed stage: a sentence-transformers model exported once, kept by content.

The export traces the model's own modules (transformer, pooling, normalisation) from the local weights with
``openvino.convert_model`` (nothing is downloaded) and keeps full-precision weights. It is cached under
``<export_dir>/openvino-<key>``, the key a hash of the model directory's files, the export recipe and the
versions of the packages that shape the graph; a changed weight file or library version exports anew.
The export is written to a temporary directory, checked against PyTorch on padded batches of several shapes
(a trace that bakes in a shape fails here, not in a run), recorded in ``export.json`` (written last: the
files' sizes and sha256) and renamed into place, readable by other users, so concurrent workers never read
half a model; a lock makes the second worker wait instead of exporting too. Every open checks the files
against ``export.json``; a broken export (truncated, deleted, or one OpenVINO cannot compile) is moved
aside and exported again, with one warning naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from apps.dataset.embedding.loading import model_digest
from core.errors import ArtifactError
from core.store import canonical_json, exclusive_lock, os_error_reason, sha256_file, staged_directory

log = logging.getLogger(__name__)

EXPORT_VERSION = "1"  # bump when the export recipe changes: it is part of the cache key
EXPORT_PACKAGES = ("openvino", "torch", "transformers", "sentence-transformers")
MODEL_XML = "model.xml"
EXPORT_RECORD = "export.json"  # written last: sizes and sha256 of the files, and the export's identity
# Export check: float32 OpenVINO against float32 PyTorch on the same padded batches.
EXPORT_TOLERANCE = 1e-4
CHECK_TEXTS = (
    "Phage lambda",
    "Sensor protein PhoQ (EC 2.7.13.3) regulates magnesium transport in Gram-negative bacteria.",
    "a",
    "Long-read sequencing of environmental samples recovers complete genomes of uncultivated microbes, "
    "including their plasmids and prophages, which short reads leave fragmented.",
)
# OpenVINO's name for the compute precision each EmbeddingConfig.dtype asks for.
PRECISIONS = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def export_identity(model_dir: str, export_dir: str) -> dict[str, Any]:
    """What the exported graph depends on: the weights, the recipe and the libraries. The weights' digest
    is kept in ``export_dir`` (hashed once per file, not once per worker)."""
    return {
        "backend": "openvino",
        "export_version": EXPORT_VERSION,
        "model_sha256": model_digest(Path(model_dir), Path(export_dir)),
        "packages": {name: _version(name) for name in EXPORT_PACKAGES},
    }


def export_path(model_dir: str, export_dir: str) -> Path:
    """The cache directory of ``model_dir``'s OpenVINO export (it may not exist yet)."""
    key = hashlib.sha256(canonical_json(export_identity(model_dir, export_dir)).encode()).hexdigest()[:16]
    return Path(export_dir) / f"openvino-{key}"


class ExportCacheError(ArtifactError):
    """The cached OpenVINO export is unusable and could not be replaced: names the folder to delete."""


@dataclass(frozen=True)
class ExportInfo:
    """An export ready to compile, and how this process got it (for the shard record and the console)."""

    directory: Path
    export_id: str  # from export.json: tells a re-export by another worker from the export that failed
    exported: bool  # True: this process exported it; False: found in the cache
    seconds: float  # how long the export took (this process's, or the one recorded in export.json)

    def as_record(self) -> dict[str, Any]:
        """The JSON-able form kept in the shard record."""
        return {
            "dir": str(self.directory),
            "exported_by_worker": self.exported,
            "seconds": round(self.seconds, 1),
        }


def _check(target: Path, identity: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """export.json of ``target`` and why the export cannot be used (None: it can).

    Every open compares each file's size with export.json (a stat: truncation, a deleted or half-copied
    file); a file whose modification time differs from the recorded one was rewritten or copied since, and
    only then is its sha256 compared. Hashing on every open would cost each worker a read of the whole
    export (16 GB of float32 weights for a 4B model); an export that passes and still fails to compile
    (bytes changed in place with the time kept) is caught at compile time and exported again.
    """
    try:
        record = json.loads((target / EXPORT_RECORD).read_text())
    except FileNotFoundError:
        return None, f"has no {EXPORT_RECORD} (an interrupted export, or one made before sizes were recorded)"
    except (OSError, ValueError) as exc:
        return None, f"{EXPORT_RECORD} is unreadable ({exc})"
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or MODEL_XML not in files:
        return None, f"{EXPORT_RECORD} lists no files (made before sizes were recorded)"
    if {k: record.get(k) for k in identity} != identity:
        return None, f"{EXPORT_RECORD} describes another model, recipe or library versions"
    for name, facts in files.items():
        try:
            stat = (target / name).stat()
        except OSError:
            return record, f"{name} is missing"
        if stat.st_size != facts.get("size"):
            return record, f"{name} has {stat.st_size} bytes, {EXPORT_RECORD} recorded {facts.get('size')}"
        if stat.st_mtime_ns != facts.get("mtime_ns") and sha256_file(target / name) != facts.get("sha256"):
            return record, f"{name} was changed since the export (its sha256 differs from {EXPORT_RECORD})"
    return record, None


def _info(target: Path, record: dict[str, Any]) -> ExportInfo:
    return ExportInfo(target, str(record.get("export_id")), False, float(record.get("seconds") or 0.0))


def prepare_export(
    model_dir: str, export_dir: str, *, failed: ExportInfo | None = None, failure: str = ""
) -> ExportInfo:
    """``model_dir``'s export, checked, exported first if missing or broken.

    ``failed``: an export OpenVINO could not compile (``failure`` says why); it is replaced unless another
    worker replaced it already. A broken export is moved aside and deleted under the lock, with one warning.
    """
    identity = export_identity(model_dir, export_dir)
    target = export_path(model_dir, export_dir)
    if failed is None:
        record, problem = _check(target, identity)
        if record is not None and problem is None:
            return _info(target, record)
    lock = contextlib.ExitStack()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not lock.enter_context(exclusive_lock(target.parent / f"{target.name}.lock")):
            log.warning("%s: the file system refuses locks; exporting without one", target.parent)
    except OSError as exc:
        raise ExportCacheError(
            f"cannot write OpenVINO exports in {target.parent}: {os_error_reason(exc, target.parent)}; "
            "set embedding.export_dir to a writable folder"
        ) from None
    with lock:
        record, problem = _check(target, identity)
        if record is not None and problem is None:
            if failed is None or record.get("export_id") != failed.export_id:
                return _info(target, record)  # exported or repaired by another worker while this one waited
            problem = f"OpenVINO cannot compile it ({failure})"
        if target.exists() or target.is_symlink():
            log.warning(
                "OpenVINO export %s is broken: %s; moving it aside and exporting again", target, problem
            )
            _discard(target)
        return _export_into(model_dir, target, identity)


def export_state(model_dir: str, export_dir: str) -> tuple[Path, str | None]:
    """Where ``model_dir``'s export lives and why it cannot be used as it is (None: cached and sound)."""
    target = export_path(model_dir, export_dir)
    try:
        if not target.exists():
            return target, "missing"
    except OSError as exc:  # a folder this user may not enter: the worker's export says how it fails
        return target, f"unreadable ({exc.strerror or exc})"
    return target, _check(target, export_identity(model_dir, export_dir))[1]


def ensure_export(model_dir: str, export_dir: str) -> Path:
    """The directory holding ``model.xml`` for ``model_dir``, exported first if missing or broken."""
    return prepare_export(model_dir, export_dir).directory


def _discard(target: Path) -> None:
    """Move a broken export aside (one rename: no reader sees it half deleted), then delete it."""
    aside = target.with_name(f".{target.name}.broken-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    try:
        os.rename(target, aside)
    except OSError as exc:
        raise ExportCacheError(
            f"OpenVINO export {target} is broken and cannot be moved aside ({exc.strerror or exc}); "
            f"delete it (rm -rf {target}) and rerun"
        ) from None
    shutil.rmtree(aside, ignore_errors=True)
    if aside.exists():
        log.warning("could not delete the broken export %s; delete it by hand", aside)


def estimate_seconds(model_dir: str) -> int:
    """A rough export time: measured 22 s for MiniLM (90 MB) on one core, most of it fixed cost."""
    size = sum(p.stat().st_size for p in Path(model_dir).rglob("*") if p.is_file())
    return round(15 + 80 * size / 1e9)


def _export_into(model_dir: str, target: Path, identity: dict[str, Any]) -> ExportInfo:
    """Export into a temporary folder beside ``target``, record it in export.json last, rename into place."""
    log.info("exporting %s to OpenVINO (once, ~%d s) into %s", model_dir, estimate_seconds(model_dir), target)
    started = time.monotonic()
    recorded = False
    try:
        with staged_directory(target) as tmp:  # 0755 less the umask: other users' workers must read it
            _export(model_dir, tmp)
            seconds = time.monotonic() - started
            files = {
                p.name: {"size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns, "sha256": sha256_file(p)}
                for p in sorted(tmp.iterdir())
                if p.is_file()
            }
            record = {**identity, "export_id": uuid.uuid4().hex, "seconds": round(seconds, 1), "files": files}
            # Written last, plainly: the folder is private until the rename, and a temp-file write would
            # make export.json 0600, unreadable to another user's workers.
            (tmp / EXPORT_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            recorded = True
    except OSError as exc:
        if not recorded:
            raise
        # The rename failed: on a file system without locks another worker may have won the race.
        winner, problem = _check(target, identity)
        if winner is not None and problem is None:
            return _info(target, winner)
        raise ExportCacheError(
            f"cannot move the new OpenVINO export into {target} ({exc.strerror or exc}); "
            f"delete {target} and rerun"
        ) from None
    log.info("exported %s to OpenVINO in %.0f s into %s", model_dir, seconds, target)
    return ExportInfo(target, record["export_id"], True, seconds)


def _export(model_dir: str, out: Path) -> None:
    """Trace the sentence-transformers model to OpenVINO IR in ``out`` and check it against PyTorch."""
    import openvino as ov
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu", local_files_only=True)
    model.eval()
    names = list(model.tokenizer.model_input_names)
    if not set(names) <= {"input_ids", "attention_mask", "token_type_ids"}:
        raise RuntimeError(f"{model_dir}: tokenizer inputs {names} are not ones the OpenVINO export knows")

    class Graph(torch.nn.Module):
        """The model's modules as a function of its named inputs, returning the sentence embedding."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):  # the tracer needs names
            features = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                features["token_type_ids"] = token_type_ids
            return self.model(features)["sentence_embedding"]

    example = {k: v for k, v in model.tokenizer(list(CHECK_TEXTS), padding=True, return_tensors="pt").items()}
    dynamic = [(name, ov.PartialShape([-1, -1]), ov.Type.i64) for name in names]
    # The tracer warns about shape branches it freezes; the checks below run other shapes instead.
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", FutureWarning)  # OpenVINO's frontend traces with torch.jit.trace
        graph = ov.convert_model(Graph().eval(), example_input={k: example[k] for k in names}, input=dynamic)
    ov.save_model(graph, out / MODEL_XML, compress_to_fp16=False)  # keep float32 weights
    compiled = ov.Core().compile_model(out / MODEL_XML, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    for texts in (CHECK_TEXTS, CHECK_TEXTS[1:2], CHECK_TEXTS[::-1] * 3):
        batch = model.tokenizer(list(texts), padding=True, return_tensors="pt")
        with torch.inference_mode():
            expected = model(dict(batch))["sentence_embedding"].float().numpy()
        got = compiled({k: batch[k].numpy() for k in names})[0]
        error = float(np.abs(got - expected).max())
        if not error <= EXPORT_TOLERANCE:
            raise RuntimeError(
                f"{model_dir}: the OpenVINO export differs from PyTorch by {error:.1e} on a batch of shape "
                f"{tuple(batch['input_ids'].shape)}; use backend sentence-transformers for this model"
            )


class OpenVINORuntime:
    """A compiled OpenVINO model on the CPU: padded int64 inputs in, float32 sentence embeddings out."""

    def __init__(self, model_dir: str, export_dir: str, dtype: str, threads: int) -> None:
        self.info = prepare_export(model_dir, export_dir)
        try:
            self.compiled = self._compile(dtype, threads)
        except RuntimeError as exc:  # what OpenVINO raises for a truncated model.bin or a garbled model.xml
            failure = _first_line(exc)
            self.info = prepare_export(model_dir, export_dir, failed=self.info, failure=failure)
            try:
                self.compiled = self._compile(dtype, threads)
            except RuntimeError as again:
                raise ExportCacheError(
                    f"OpenVINO cannot compile the export in {self.info.directory}, even exported anew "
                    f"({_first_line(again)}); delete {self.info.directory} and rerun, or use backend "
                    "sentence-transformers for this model"
                ) from None
        self.export = self.info.directory
        self.request = self.compiled.create_infer_request()
        self.input_names = {name for port in self.compiled.inputs for name in port.get_names()}
        self.dimension = int(self.compiled.outputs[0].get_partial_shape()[1].get_length())
        # What the plugin really runs at (a CPU without bf16 units runs a bf16 hint in f32).
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
        self.precision = {v: k for k, v in PRECISIONS.items()}.get(hint, hint)
        log.info("OpenVINO runs %s (asked %s) from %s", self.precision, dtype, self.export)

    def _compile(self, dtype: str, threads: int) -> Any:
        import openvino as ov

        return ov.Core().compile_model(
            self.info.directory / MODEL_XML,
            "CPU",
            {
                "INFERENCE_PRECISION_HINT": PRECISIONS[dtype],
                "INFERENCE_NUM_THREADS": threads,
                "NUM_STREAMS": 1,  # one request at a time per worker: workers are the parallelism
                # OpenVINO pins each process's threads from core 0 up, blind to the other workers on the
                # node: two 1-thread workers then share one core (measured: half the throughput each).
                # The OS, or the executor's cpu_affinity, places workers instead.
                "ENABLE_CPU_PINNING": False,
                "PERFORMANCE_HINT": "LATENCY",
            },
        )

    def __call__(self, features: dict[str, np.ndarray]) -> np.ndarray:
        """Sentence embeddings of one padded batch (a copy: the request reuses its output buffer)."""
        self.request.infer({k: v for k, v in features.items() if k in self.input_names})
        return np.array(self.request.get_output_tensor(0).data, dtype=np.float32)


def _first_line(exc: BaseException) -> str:
    """The telling line of an OpenVINO error (its first lines are source locations)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith("Exception from ")]
    return (useful or lines or [type(exc).__name__])[-1]
