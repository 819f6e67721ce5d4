"""The exact top-k is the same everywhere: any OpenBLAS kernel, FAISS SIMD level, thread count, block size,
and the FAISS and torch paths give the same ids and the same distances, bit for bit (tolerance zero).

The inputs (``tests/dataset/exact_probe.py``) are built to break a float32 ranking: vectors repeated 40 times,
near-duplicates one float32 step apart, and the real fmnist1k with a fifth of its rows repeated. The
reference ranks every pair by the float64 definition (``apps.dataset.groundtruth.exact_distance``) with no
candidate search, so a neighbour the search lost at a block's cut would show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from apps.dataset.groundtruth.exact_distance import ranking_values, reported
from apps.dataset.groundtruth.exact_search import ExactSearch
from apps.dataset.groundtruth.faiss_kernel import FaissExactSearch, FaissKernel
from apps.dataset.groundtruth.stage import exact_topk
from apps.dataset.groundtruth.torch_kernel import TorchExactSearch, TorchKernel
from tests.conftest import REPO
from tests.dataset import exact_probe

# OpenBLAS kernels (OPENBLAS_CORETYPE) with the CPU flags each needs, oldest first.
OPENBLAS_KERNELS = {
    "Prescott": {"pni"},
    "Sandybridge": {"avx"},
    "Haswell": {"avx2", "fma"},
    "Zen": {"avx2", "fma"},
    "SkylakeX": {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"},
}
FAISS_SIMD = {
    "NONE": set(),
    "AVX2": {"avx2", "fma"},
    "AVX512": {"avx512f", "avx512bw", "avx512dq", "avx512vl"},
}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def pinned_environments() -> list[dict[str, str]]:
    """Each OpenBLAS kernel and each FAISS SIMD level this CPU can execute, one variable pinned at a time,
    and the two oldest together."""
    flags = cpu_flags()
    kernels = [name for name, need in OPENBLAS_KERNELS.items() if need <= flags]
    levels = [name for name, need in FAISS_SIMD.items() if need <= flags]
    envs = [{"OPENBLAS_CORETYPE": name} for name in kernels]
    envs += [
        {"FAISS_SIMD_LEVEL": name, "FAISS_OPT_LEVEL": name.lower().replace("none", "generic")}
        for name in levels
    ]
    if kernels and levels:
        envs.append({"OPENBLAS_CORETYPE": kernels[0], "FAISS_SIMD_LEVEL": levels[0]})
    return envs


@pytest.fixture(scope="module")
def fmnist_dir(shared_data: Path) -> Path:
    return shared_data / "ann" / "fmnist1k"


@pytest.fixture(scope="module")
def reference(fmnist_dir: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """case/metric -> (ids, distances) ranked over every pair by the float64 definition, ties by id."""
    out = {}
    for name, (base, queries, k) in exact_probe.cases(fmnist_dir).items():
        positions = np.arange(len(base))
        for metric in exact_probe.METRICS:
            values = np.concatenate(
                [
                    ranking_values(queries[lo : lo + 8, None, :], base[None], metric)
                    for lo in range(0, len(queries), 8)
                ]
            )
            order = np.lexsort((np.broadcast_to(positions, values.shape), values), axis=-1)[:, :k]
            ids = order
            dist = reported(np.take_along_axis(values, order, axis=1), metric).astype(np.float32)
            out[f"{name}/{metric}"] = ids, dist
    return out


@pytest.fixture(scope="module")
def in_process(fmnist_dir: Path) -> dict[str, np.ndarray]:
    """This process's answers for 1–3 threads and two block sizes (besides the stage's own)."""
    return exact_probe.answers(fmnist_dir, threads_list=(1, 2, 3), rows_list=(64, 1000))


def assert_same_as_reference(found: dict[str, np.ndarray], reference: dict, where: str) -> None:
    assert found, where
    for key in sorted(k for k in found if k.endswith("/ids")):
        case = "/".join(key.split("/")[:2])
        ids, dist = reference[case]
        np.testing.assert_array_equal(found[key], ids, err_msg=f"{where}: {key}")
        np.testing.assert_array_equal(found[key[:-4] + "/dist"], dist, err_msg=f"{where}: {key[:-4]}/dist")


def test_threads_and_block_sizes_give_the_reference_bit_for_bit(in_process, reference) -> None:
    assert len(in_process) == 2 * 3 * 3 * (3 * 2 + 1)  # cases x metrics x (threads x rows + stage)
    assert_same_as_reference(in_process, reference, "this process")


@pytest.mark.parametrize("threads", [1, 2])
def test_torch_path_gives_the_faiss_answer_bit_for_bit(fmnist_dir, reference, threads: int) -> None:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for name, (base, queries, k) in exact_probe.cases(fmnist_dir).items():
            for metric in exact_probe.METRICS:
                search = TorchExactSearch(queries, k, metric, "cpu", threads=threads)  # query slices
                for ids, vecs in exact_probe.batches(base, 97):
                    search.add(ids, vecs)
                got_ids, got_dist = search.result()
                ids, dist = reference[f"{name}/{metric}"]
                np.testing.assert_array_equal(got_ids, ids, err_msg=f"torch {name}/{metric}")
                np.testing.assert_array_equal(got_dist, dist, err_msg=f"torch {name}/{metric}")
    finally:
        torch.set_num_threads(saved)


def test_every_blas_kernel_and_simd_level_gives_the_reference(fmnist_dir, reference, tmp_path) -> None:
    """Subprocesses pinned to each OpenBLAS kernel and FAISS SIMD level the CPU can run, two at a time."""
    envs = pinned_environments() or [{}]
    running: list[subprocess.Popen] = []
    for number, pinned in enumerate(envs):
        out = tmp_path / f"probe-{number}.npz"
        env = {**os.environ, **pinned, "PYTHONPATH": str(REPO)}
        command = [
            sys.executable,
            str(REPO / "tests" / "dataset" / "exact_probe.py"),
            str(out),
            "--fmnist",
            str(fmnist_dir),
        ]
        if len(running) == 2:
            running.pop(0).wait(timeout=300)
        running.append(subprocess.Popen(command, env=env, cwd=REPO))
    for proc in running:
        proc.wait(timeout=300)
    finished = []
    for number, pinned in enumerate(envs):
        out = tmp_path / f"probe-{number}.npz"
        assert out.exists(), f"the probe pinned to {pinned} wrote nothing"
        ran = json.loads(out.with_suffix(".json").read_text())
        if "OPENBLAS_CORETYPE" in pinned:  # the pin took: some OpenBLAS runs that kernel
            assert pinned["OPENBLAS_CORETYPE"] in ran["openblas"].values(), (pinned, ran)
        if "FAISS_SIMD_LEVEL" in pinned and ran["faiss_simd"] is not None:
            assert ran["faiss_simd"] == pinned["FAISS_SIMD_LEVEL"], (pinned, ran)
        with np.load(out) as answers:
            assert_same_as_reference(dict(answers), reference, f"pinned to {pinned}, ran {ran}")
        finished.append(ran)
    assert len(finished) == len(envs)


def test_gpu_benchmark_script_checks_against_a_carried_faiss_answer(tmp_path: Path) -> None:
    """``python -m benchmarks.groundtruth_gpu`` as run on a GPU machine, smoke-tested here on the CPU: FAISS's
    answer written to a file, the data regenerated from its seed and checksum, the torch path compared."""
    script = [sys.executable, "-m", "benchmarks.groundtruth_gpu", "--rows", "3000"]
    script += ["--queries", "64", "--k", "20", "--block-rows", "700", "--metric", "l2"]
    expected = tmp_path / "expected.npz"
    subprocess.run([*script, "--write-expected", str(expected)], check=True, cwd=REPO, timeout=300)
    figures = tmp_path / "gpu.json"
    run = [*script, "--expected", str(expected), "--device", "cpu", "--repeat", "1", "--json", str(figures)]
    subprocess.run(run, check=True, cwd=REPO, timeout=300)
    result = json.loads(figures.read_text())
    assert result["identical_to_faiss"] is True and result["identical_to_cpu_torch"] is True
    assert result["synthetic"] and result["met"]
    other = [*script[:4], "3001", *script[5:], "--expected", str(expected), "--device", "cpu"]
    refused = subprocess.run(other, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "made for other data" in refused.stdout


def test_repeats_in_groups_of_bounded_pairs_give_the_same_answer(fmnist_dir, reference) -> None:
    """A repeated call for many queries is split into groups of at most ``max_pairs`` (query, row) pairs:
    the memory of a block full of ties stays bounded, and the answer does not change."""
    base, queries, k = exact_probe.cases(fmnist_dir)["duplicates"]
    search = ExactSearch(queries, k, "l2", FaissKernel(queries, "l2"), max_pairs=3 * k)
    for ids, vecs in exact_probe.batches(base, 500):
        search.add(ids, vecs)
    got_ids, got_dist = search.result()
    assert search.repeats > 0 and search.searches > 2 * len(queries) // 3  # groups of <= 3 queries
    ids, dist = reference["duplicates/l2"]
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(got_dist, dist)


def test_process_wide_kernel_settings_are_restored_after_threaded_searches() -> None:
    """FAISS's BLAS switch and torch's float32 matmul precision are set once around a block on the calling
    thread, never by the slice threads (which could restore each other's values and leave them changed)."""
    import faiss
    import torch

    rng = np.random.default_rng(9)
    base = rng.normal(size=(2000, 32)).astype(np.float32)
    queries = rng.normal(size=(256, 32)).astype(np.float32)
    threshold = faiss.cvar.distance_compute_blas_threshold
    search = FaissExactSearch(queries, 10, "l2", threads=2)
    assert search.parallel == 2
    for ids, vecs in exact_probe.batches(base, 400):
        search.add(ids, vecs)
    search.result()
    assert faiss.cvar.distance_compute_blas_threshold == threshold

    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # a user's TF32 choice
    try:
        seen = []
        kernel_knn = TorchKernel.knn

        def spy(self, *args):
            seen.append(
                torch.backends.cuda.matmul.fp32_precision
                if hasattr(torch.backends.cuda.matmul, "fp32_precision")
                else torch.get_float32_matmul_precision()
            )
            return kernel_knn(self, *args)

        TorchKernel.knn = spy
        try:
            search = TorchExactSearch(queries, 10, "l2", "cpu", threads=2)
            for ids, vecs in exact_probe.batches(base, 400):
                search.add(ids, vecs)
            search.result()
        finally:
            TorchKernel.knn = kernel_knn
        assert seen and set(seen) <= {"ieee", "highest"}, seen  # full float32 inside every call
        assert torch.get_float32_matmul_precision() == "high"  # the user's choice afterwards
    finally:
        torch.set_float32_matmul_precision(saved)


@pytest.mark.parametrize(
    ("where", "scale", "message"),
    [
        ("base", 1e-23, r"base vector id 7 has L2 norm .* outside"),
        ("base", 1e20, r"base vector id 7 has L2 norm .* outside"),
        ("base", np.nan, r"base vector id 7 holds NaN or infinity"),
        ("query", 1e20, r"query row 3 has L2 norm .* outside"),
    ],
)
def test_vectors_the_float32_kernels_cannot_rank_are_refused(where: str, scale: float, message: str) -> None:
    """Norms whose float32 squares underflow or overflow (or NaN) would void the error bound: refused by
    name, on both paths, instead of a silently wrong top-k."""
    rng = np.random.default_rng(10)
    base = rng.normal(size=(50, 16)).astype(np.float32)
    queries = rng.normal(size=(5, 16)).astype(np.float32)
    (base if where == "base" else queries)[7 if where == "base" else 3] *= np.float32(scale)
    for engine in ("faiss", "torch"):
        with pytest.raises(ValueError, match=message):
            exact_topk(queries, exact_probe.batches(base, 20), 5, "cosine", engine=engine)
    zero = base.copy()
    zero[7] = 0.0  # a zero vector is fine: cosine 0, as FAISS and torch normalise it
    if where == "base" and np.isfinite(scale):
        ids, _ = exact_topk(queries, exact_probe.batches(zero, 20), 5, "cosine")
        assert ids.shape == (5, 5)
