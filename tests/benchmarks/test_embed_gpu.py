"""The accelerator embed benchmark (``python -m benchmarks.embed --device ...``): its smoke test on the CPU
at a tiny shape, so the one call a GPU machine gets runs the script that CI ran; its MFU arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common import qwen3
from benchmarks.embed.gpu import peak_flops
from tests.conftest import REPO


def test_smoke_run_on_the_cpu_measures_both_sides_and_checks_the_ground_truth(
    tmp_path: Path, shared_data: Path
) -> None:
    out = tmp_path / "embed_gpu.json"
    gt = "--rows 3000 --dim 32 --queries 40 --k 10 --repeat 1"
    command = [sys.executable, "-m", "benchmarks.embed", "--device", "cpu", "--shape", "tiny"]
    command += ["--texts", "64", "--max-length", "96", "--repeat", "1", "--gt-args", gt, "--json", str(out)]
    command += ["--tokenizer", str(shared_data / "qwen-tokenizer")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["synthetic_weights"] and result["shape"] == "tiny" and result["texts"] == 64
    assert set(result["tokens_per_s"]) == {"embed stage", "sentence-transformers"}
    assert all(rate > 0 for rate in result["tokens_per_s"].values())
    assert result["tokens_per_round"] > 64  # every text has tokens and its end token
    assert result["agree"] and result["min_cosine"] >= 1 - 2e-3
    assert result["mfu"] is None and result["peak_flops"] is None  # no peak for a CPU
    assert result["groundtruth"]["identical_to_faiss"] and result["groundtruth"]["passed"]
    assert "RANDOMLY INITIALISED" in done.stdout and "MFU n/a" in done.stdout


@pytest.mark.parametrize("spelling", [["--device", "xpu"], ["--device=xpu"]])
def test_without_the_device_it_says_so_and_exits_zero(tmp_path: Path, spelling: list[str]) -> None:
    out = tmp_path / "skipped.json"
    command = [sys.executable, "-m", "benchmarks.embed", *spelling, "--json", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no xpu device here: skipped" in done.stdout
    assert json.loads(out.read_text()) == {"skipped": "no xpu device"}


def test_mfu_counts_the_parameters_of_qwen3_embedding_4b_and_the_gpu_peaks() -> None:
    counts = qwen3.parameters(qwen3.QWEN3_EMBEDDING_4B, 151_669)
    assert 4.0e9 < counts["total"] < 4.05e9  # the model card's 4B (4.02B with the embedding table)
    assert counts["matmul"] == 36 * (2560 * 4096 * 2 + 2 * 2560 * 1024 + 3 * 2560 * 9728)
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("NVIDIA H200 NVL") == 835e12
    assert peak_flops("Intel(R) Data Center GPU Max 1550") is None  # not in the table: no MFU claimed
