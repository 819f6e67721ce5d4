"""The embed stage on an accelerator, at Qwen3-Embedding-4B's shape, against ``SentenceTransformer.encode``.

``python -m benchmarks.embed --device cuda`` (this module's ``main``):

* builds a **randomly initialised** model of Qwen3-Embedding-4B's shape (its config.json: hidden size
  2,560, 36 layers, 32 query and 8 key-value heads, MLP 9,728; ``benchmarks/common/qwen3.py``) in the
  hub's layout, in bfloat16; weights do not change throughput;
* embeds the bundled peS2o abstracts (real text, ``datasets/pes2o-sample``) with the embed stage's
  ``Embedder`` (backend ``transformers``: token-budget batches over length-sorted texts, last-token
  pooling) and with ``SentenceTransformer(dir).encode(texts, batch_size=...)`` on the same device, in the
  same precision, over the same token ids, rounds alternating; checks the vectors agree;
* reports tokens/s of both, their ratio (target >= 1.3x) and the embed stage's MFU: 2 x the parameters
  in matrix products x tokens/s over the device's dense bf16 peak (target >= 40% on an H100). Attention's
  own FLOPs (the score and value products) are left out, so the MFU is a lower bound;
* then runs the ground truth's GPU path against FAISS's answer (``benchmarks.groundtruth_gpu``), on data
  given by ``--gt-expected`` when FAISS is not installed on the GPU machine.

``--device cpu --shape tiny`` is the smoke test of the script itself (CI runs it); without the device it
says so and exits 0. One call, under 10 minutes on an H100:

    python -m benchmarks.embed --device cuda --gt-expected benchmarks/out/gt-expected.npz
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common
from benchmarks.common import qwen3
from benchmarks.embed.report import agreement

NAME = "embed_gpu"
TARGET_RATIO = 1.3
TARGET_MFU = 0.40
COSINE_TOLERANCE = 2e-3  # bfloat16 on both sides, different batch shapes
# Dense bf16 tensor-core peaks, FLOP/s, from NVIDIA's data sheets (H100: "H100 Tensor Core GPU" data
# sheet, SXM 989.4, NVL 835 and PCIe 756 TFLOPS without sparsity; H200: "H200 Tensor Core GPU" data sheet,
# 989 TFLOPS, NVL 835; A100: "A100 Tensor Core GPU" data sheet, 312 TFLOPS). Longest name first.
BF16_PEAK = (
    ("H100 PCIe", 756e12),
    ("H200 NVL", 835e12),
    ("H100 NVL", 835e12),
    ("H100", 989.4e12),
    ("H200", 989e12),
    ("A100", 312e12),
)


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a device, by its name (None: not in the table, or a CPU)."""
    return next((peak for key, peak in BF16_PEAK if key in device_name), None)


def read_texts(count: int) -> list[str]:
    """The first ``count`` abstracts of the bundled peS2o sample, repeated if more are asked."""
    with gzip.open(common.SAMPLE, "rt", encoding="utf-8") as handle:
        texts = [json.loads(line)["text"] for line in handle if line.strip()]
    return [texts[i % len(texts)] for i in range(count)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.embed --device", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--device", required=True, choices=["cuda", "xpu", "cpu"])
    parser.add_argument("--shape", choices=sorted(qwen3.SHAPES), default="qwen3-embedding-4b")
    parser.add_argument("--texts", type=int, default=2000, help="abstracts to embed per round (2,000)")
    parser.add_argument("--max-length", type=int, default=512, help="tokens per text at most (512)")
    parser.add_argument(
        "--token-budget", type=int, default=65536, help="embed stage: padded tokens per batch"
    )
    parser.add_argument(
        "--max-batch-size", type=int, default=256, help="embed stage: texts per batch at most"
    )
    parser.add_argument("--batch-size", type=int, default=32, help="encode's batch size (32)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, order alternating (3)")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=common.SHARED_DATA / "qwen-tokenizer",
        help="a Qwen2 vocabulary (vocab.json, merges.txt, tokenizer_config.json); default "
        "../shared/data/qwen-tokenizer",
    )
    parser.add_argument(
        "--gt-expected",
        type=Path,
        help="FAISS's answer (python -m benchmarks.groundtruth_gpu --write-expected)",
    )
    parser.add_argument("--gt-args", default="", help="more arguments for benchmarks.groundtruth_gpu")
    parser.add_argument("--json", type=Path, default=common.OUT / f"{NAME}.json", help="where the figures go")
    return parser.parse_args(argv)


def available(device: str) -> bool:
    import torch

    if device == "cuda":
        return torch.cuda.is_available()
    if device == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    return True


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    if device == "xpu":
        return torch.xpu.get_device_name()
    return f"cpu ({common.cores()} cores)"


class Side:
    """One way of embedding the texts, timed per round (the harness owns the clock)."""

    def __init__(self, embed) -> None:
        self.embed, self.seconds = embed, []
        self.vectors: np.ndarray | None = None

    def run(self, texts: list[str], sync) -> None:
        sync()
        started = time.perf_counter()
        vectors = self.embed(texts)
        sync()
        self.seconds.append(time.perf_counter() - started)
        self.vectors = np.asarray(vectors, dtype=np.float32)


def measure(args: argparse.Namespace, model_dir: Path, dtype: str, texts: list[str]) -> dict[str, Any]:
    """Both sides over the same texts, rounds alternating; tokens/s, ratio, MFU and agreement."""
    import torch
    from sentence_transformers import SentenceTransformer

    from apps.dataset.embedding.model import Embedder, EmbeddingConfig

    embedding = EmbeddingConfig(
        backend="transformers",
        model=str(model_dir),
        pooling="last_token",
        dtype=dtype,
        max_length=args.max_length,
        token_budget=args.token_budget,
        max_batch_size=args.max_batch_size,
        attn_implementation="sdpa",
    )
    embedder = Embedder(embedding)
    reference = SentenceTransformer(
        str(model_dir),
        device=args.device,
        local_files_only=True,
        model_kwargs={"torch_dtype": getattr(torch, dtype), "attn_implementation": "sdpa"},
    )
    reference.max_seq_length = args.max_length
    sync = {"cuda": torch.cuda.synchronize, "xpu": getattr(torch, "xpu", None) and torch.xpu.synchronize}
    sync_device = sync.get(args.device) or (lambda: None)
    tokens = sum(len(e.ids) for e in embedder.encode_ids(texts))
    sides = {
        "embed stage": Side(lambda t: embedder.embed(t, is_query=False)[0]),
        "sentence-transformers": Side(
            lambda t: reference.encode(t, batch_size=args.batch_size, convert_to_tensor=True).float().cpu()
        ),
    }
    for side in sides.values():  # warm-up: kernels chosen, memory pools grown
        side.embed(texts[: min(len(texts), 64)])
    for index in range(args.repeat):
        order = list(sides.values()) if index % 2 == 0 else list(sides.values())[::-1]
        for side in order:
            side.run(texts, sync_device)
        ours, theirs = sides["embed stage"], sides["sentence-transformers"]
        print(
            f"  round {index + 1}/{args.repeat}: embed stage {tokens / ours.seconds[-1]:,.0f} tokens/s, "
            f"sentence-transformers {tokens / theirs.seconds[-1]:,.0f} tokens/s; load average "
            f"{os.getloadavg()[0]:.2f}"
        )
    cosine = agreement(sides["embed stage"].vectors, sides["sentence-transformers"].vectors)["min_cosine"]
    rates = {name: tokens / statistics.median(side.seconds) for name, side in sides.items()}
    counts = qwen3.parameters(qwen3.SHAPES[args.shape], embedder.model.config.vocab_size)
    peak = peak_flops(device_name(args.device)) if args.device != "cpu" else None
    mfu = 2 * counts["matmul"] * rates["embed stage"] / peak if peak else None
    return {
        "dtype": dtype,
        "tokens_per_round": tokens,
        "seconds": {name: side.seconds for name, side in sides.items()},
        "tokens_per_s": rates,
        "ratio": rates["embed stage"] / rates["sentence-transformers"],
        "min_cosine": cosine,
        "parameters": counts,
        "peak_flops": peak,
        "mfu": mfu,
    }


def groundtruth_check(args: argparse.Namespace) -> dict[str, Any]:
    """benchmarks.groundtruth_gpu on the same device: the GPU path's ids and distances against FAISS's.

    Passes only when they were compared with FAISS's answer (FAISS here, or carried by --gt-expected).
    """
    from benchmarks.groundtruth_gpu.__main__ import main as groundtruth_gpu

    out = args.json.with_name(f"{NAME}-groundtruth.json")
    out.unlink(missing_ok=True)  # never read an earlier run's figures
    argv = ["--device", args.device, "--json", str(out), *args.gt_args.split()]
    if args.gt_expected:
        argv += ["--expected", str(args.gt_expected)]
    code = groundtruth_gpu(argv)
    result = json.loads(out.read_text()) if out.is_file() else {"error": "no figures written (see above)"}
    compared = result.get("identical_to_faiss") is True
    if result.get("identical_to_faiss") is None and "error" not in result:
        print("  ground truth: not compared with FAISS (not installed here): pass --gt-expected")
    return {"exit_code": code, "passed": code == 0 and compared, **result}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.device == "cpu":  # before torch starts CUDA: the embed stage picks its device itself
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    args.json.parent.mkdir(parents=True, exist_ok=True)
    if not available(args.device):
        print(f"no {args.device} device here: skipped")
        args.json.write_text(json.dumps({"skipped": f"no {args.device} device"}))
        return 0
    name = device_name(args.device)
    shape = qwen3.SHAPES[args.shape]
    texts = read_texts(args.texts)
    print(
        f"embed on {name}: a RANDOMLY INITIALISED Qwen3 of shape {args.shape} ({shape['num_hidden_layers']} "
        f"layers, hidden {shape['hidden_size']}), {len(texts)} real peS2o abstracts, max_length "
        f"{args.max_length}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    common.OUT.mkdir(parents=True, exist_ok=True)  # a fresh clone has none; a 4B model may not fit /tmp
    dtype = "bfloat16" if args.device != "cpu" else "float32"  # the GPU recipe; float32 for the smoke test
    with tempfile.TemporaryDirectory(prefix="qwen3-", dir=common.OUT) as tmp:
        started = time.perf_counter()
        model_dir = qwen3.write_model(Path(tmp), args.tokenizer, shape, dtype=dtype, device=args.device)
        print(f"  model written in {time.perf_counter() - started:.0f} s")
        figures = measure(args, model_dir, dtype, texts)
    ratio, mfu, cosine = figures["ratio"], figures["mfu"], figures["min_cosine"]
    agree = 1 - cosine <= COSINE_TOLERANCE
    print(
        f"embed stage {figures['tokens_per_s']['embed stage']:,.0f} tokens/s, sentence-transformers "
        f"{figures['tokens_per_s']['sentence-transformers']:,.0f} tokens/s: {ratio:.2f}x (target >= "
        f"{TARGET_RATIO}x); MFU "
        + (
            f"{mfu:.1%} of {figures['peak_flops'] / 1e12:.0f} TFLOP/s"
            if mfu is not None
            else "n/a (no peak known)"
        )
        + f" (target >= {TARGET_MFU:.0%} on an H100); vectors agree to {1 - cosine:.1e} in cosine "
        f"(tolerance {COSINE_TOLERANCE:.0e})"
    )
    result = {
        "name": NAME,
        "device": name,
        "shape": args.shape,
        "synthetic_weights": True,
        "texts": len(texts),
        "max_length": args.max_length,
        "batch_size": args.batch_size,
        **figures,
        "agree": agree,
        "load_average": os.getloadavg(),
    }
    args.json.write_text(json.dumps(result, indent=2))  # kept even if the ground-truth step fails
    gt = groundtruth_check(args)
    met = agree and ratio >= TARGET_RATIO and (mfu is None or mfu >= TARGET_MFU) and gt["passed"]
    result.update(groundtruth=gt, met=met)
    args.json.write_text(json.dumps(result, indent=2))
    print(f"raw numbers: {args.json}")
    return 0 if agree and gt["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
