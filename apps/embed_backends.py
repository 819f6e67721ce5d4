"""The OpenVINO CPU runtime of the embed stage: a sentence-transformers model exported once, kept by content.

The export traces the model's own modules (transformer, pooling, normalisation) from the local weights with
``openvino.convert_model`` (nothing is downloaded) and keeps full-precision weights. It is cached under
``<export_dir>/openvino-<key>``, the key a hash of the model directory's files, the export recipe and the
versions of the packages that shape the graph; a changed weight file or library version exports anew.
The export is written to a temporary directory, checked against PyTorch on padded batches of several shapes
(a trace that bakes in a shape fails here, not in a run), and renamed into place, so concurrent workers
never read half a model; a lock makes the second worker wait instead of exporting too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from core.store import canonical_json

log = logging.getLogger(__name__)

EXPORT_VERSION = "1"  # bump when the export recipe changes: it is part of the cache key
EXPORT_PACKAGES = ("openvino", "torch", "transformers", "sentence-transformers")
MODEL_XML = "model.xml"
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


@cache
def model_digest(model_dir: str) -> str:
    """sha256 over every file of a model directory (relative name and bytes)."""
    digest = hashlib.sha256()
    root = Path(model_dir)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def export_identity(model_dir: str) -> dict[str, Any]:
    """What the exported graph depends on: the weights, the recipe and the libraries."""
    return {
        "backend": "openvino",
        "export_version": EXPORT_VERSION,
        "model_sha256": model_digest(model_dir),
        "packages": {name: _version(name) for name in EXPORT_PACKAGES},
    }


def export_path(model_dir: str, export_dir: str) -> Path:
    """The cache directory of ``model_dir``'s OpenVINO export (it may not exist yet)."""
    key = hashlib.sha256(canonical_json(export_identity(model_dir)).encode()).hexdigest()[:16]
    return Path(export_dir) / f"openvino-{key}"


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive lock file; a file system without locks (some parallel ones) runs unlocked."""
    import fcntl

    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            log.warning("%s: the file system refuses locks; exporting without one", path)
        yield


def ensure_export(model_dir: str, export_dir: str) -> Path:
    """The directory holding ``model.xml`` for ``model_dir``, exporting it first if it is not cached."""
    target = export_path(model_dir, export_dir)
    if (target / MODEL_XML).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _lock(target.parent / f"{target.name}.lock"):
        if (target / MODEL_XML).exists():  # another worker exported it while this one waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            _export(model_dir, tmp)
            (tmp / "export.json").write_text(json.dumps(export_identity(model_dir), indent=2) + "\n")
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("exported %s to OpenVINO in %s", model_dir, target)
    return target


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
        import openvino as ov

        self.export = ensure_export(model_dir, export_dir)
        self.compiled = ov.Core().compile_model(
            self.export / MODEL_XML,
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
        self.request = self.compiled.create_infer_request()
        self.input_names = {name for port in self.compiled.inputs for name in port.get_names()}
        self.dimension = int(self.compiled.outputs[0].get_partial_shape()[1].get_length())
        # What the plugin really runs at (a CPU without bf16 units runs a bf16 hint in f32).
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
        self.precision = {v: k for k, v in PRECISIONS.items()}.get(hint, hint)

    def __call__(self, features: dict[str, np.ndarray]) -> np.ndarray:
        """Sentence embeddings of one padded batch (a copy: the request reuses its output buffer)."""
        self.request.infer({k: v for k, v in features.items() if k in self.input_names})
        return np.array(self.request.get_output_tensor(0).data, dtype=np.float32)
