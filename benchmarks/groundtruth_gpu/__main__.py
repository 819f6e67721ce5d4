"""The ground truth's GPU path (torch candidates on cuda, xpu) against FAISS's answer: same bits, how fast.

The exact top-k is decided in float64 on the CPU whatever proposes the candidates (``docs/groundtruth.md``),
so the GPU path must give FAISS's ids *and* distances bit for bit. This benchmark checks that on data made
to break a float32 ranking (uniform random vectors, every tenth row a copy of an earlier one, every tenth
a copy nudged by one float32 step), and times the GPU path against the CPU path on the same machine
(FAISS when it is installed, else torch on the CPU), with the share of the time the float64 re-scoring
takes.

A GPU machine may lack FAISS (and the network): compute FAISS's answer where FAISS runs, carry the file,
and check against it there. The data is generated again from its seed and its checksum compared, so the
two sides cannot silently differ (both from the repository root):

    .venv/bin/python -m benchmarks.groundtruth_gpu --write-expected benchmarks/out/gt-expected.npz
    python3 -m benchmarks.groundtruth_gpu --expected benchmarks/out/gt-expected.npz   # on the GPU machine

Without a GPU it says so and exits 0 (``make bench`` runs it too).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "benchmarks" / "out"

NAME = "groundtruth_gpu"


def uniform(count: int, seed: int) -> np.ndarray:
    """``count`` float32 values in [-0.5, 0.5) from splitmix64 of a counter: the same on every numpy."""
    with np.errstate(over="ignore"):
        z = np.arange(count, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(40)).astype(np.float32) / np.float32(2**24) - np.float32(0.5)


def make_data(rows: int, dim: int, queries: int, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """(base, queries, sha256 of both): uniform vectors with exact and one-step copies (synthetic)."""
    base = uniform(rows * dim, seed).reshape(rows, dim)
    copies = np.arange(10, rows, 10)
    base[copies] = base[copies // 3]  # exact duplicates of earlier rows
    nudged = np.arange(15, rows, 10)
    base[nudged] = base[nudged // 3]
    base[nudged, 0] = np.nextafter(base[nudged, 0], np.float32(np.inf))  # one float32 step apart
    q = uniform(queries * dim, seed + 1).reshape(queries, dim)
    digest = hashlib.sha256(base.tobytes() + q.tobytes()).hexdigest()
    return base, q, digest


def blocks(base: np.ndarray, rows: int):
    for start in range(0, len(base), rows):
        yield np.arange(start, min(start + rows, len(base)), dtype=np.int64), base[start : start + rows]


def run_search(search, base: np.ndarray, rows: int, sync=None) -> tuple[np.ndarray, np.ndarray, float]:
    started = time.perf_counter()
    for ids, vecs in blocks(base, rows):
        search.add(ids, vecs)
    found = search.result()
    if sync:
        sync()
    return found[0], found[1], time.perf_counter() - started


def faiss_answer(base, queries, k, metric, rows):
    from apps.dataset.groundtruth.faiss_kernel import FaissExactSearch

    return run_search(FaissExactSearch(queries, k, metric), base, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="base rows (200,000)")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=2_000)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--metric", default="cosine", choices=["cosine", "ip", "l2"])
    parser.add_argument("--block-rows", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--write-expected", type=Path, help="compute FAISS's answer here and write it")
    parser.add_argument("--expected", type=Path, help="FAISS's answer written by --write-expected")
    parser.add_argument("--json", type=Path, default=OUT / f"{NAME}.json", help="where the figures go")
    args = parser.parse_args(argv)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    base, queries, digest = make_data(args.rows, args.dim, args.queries, args.seed)
    shape = dict(rows=args.rows, dim=args.dim, queries=args.queries, k=args.k, metric=args.metric)
    print(
        f"ground truth GPU path: {args.rows:,} x {args.dim} base (SYNTHETIC: uniform, 10% exact and 10% "
        f"one-step copies), {args.queries:,} queries, k={args.k}, {args.metric}; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )

    if args.write_expected:
        ids, dist, seconds = faiss_answer(base, queries, args.k, args.metric, args.block_rows)
        np.savez(args.write_expected, ids=ids, dist=dist, sha256=digest, shape=json.dumps(shape))
        print(f"FAISS's answer in {seconds:.1f} s -> {args.write_expected}")
        return 0

    import torch

    device = args.device
    available = (
        device == "cpu"  # a smoke test of the script itself
        or (device == "cuda" and torch.cuda.is_available())
        or (device == "xpu" and hasattr(torch, "xpu") and torch.xpu.is_available())
    )
    if not available:
        print(f"no {device} device here: skipped")
        args.json.write_text(json.dumps({"skipped": f"no {device} device"}))
        return 0
    sync = {"cuda": torch.cuda.synchronize, "xpu": getattr(torch, "xpu", None) and torch.xpu.synchronize}
    name = torch.cuda.get_device_name() if device == "cuda" else device

    if args.expected:
        with np.load(args.expected) as expected:
            if str(expected["sha256"]) != digest or json.loads(str(expected["shape"])) != shape:
                print(f"error: {args.expected} was made for other data (checksum or shape differs)")
                return 2
            ref_ids, ref_dist, peer = expected["ids"], expected["dist"], "FAISS (carried)"
        peer_seconds = None
    else:
        try:
            ref_ids, ref_dist, peer_seconds = faiss_answer(
                base, queries, args.k, args.metric, args.block_rows
            )
            peer = "FAISS on this machine's CPU"
        except ImportError:
            ref_ids = ref_dist = None
            peer = None
            peer_seconds = None

    from apps.dataset.groundtruth.torch_kernel import TorchExactSearch

    gpu_times = []
    for _ in range(args.repeat):
        search = TorchExactSearch(queries, args.k, args.metric, device)
        ids, dist, seconds = run_search(search, base, args.block_rows, sync.get(device))
        gpu_times.append(seconds)
    cpu_search = TorchExactSearch(queries, args.k, args.metric, "cpu")
    cpu_ids, cpu_dist, cpu_seconds = run_search(cpu_search, base, args.block_rows)
    if peer_seconds is None:
        peer_seconds = cpu_seconds
    same_cpu = bool(np.array_equal(ids, cpu_ids) and np.array_equal(dist, cpu_dist))
    same_faiss = None
    if ref_ids is not None:
        same_faiss = bool(np.array_equal(ids, ref_ids) and np.array_equal(dist, ref_dist))
    gpu = statistics.median(gpu_times)
    ratio = peer_seconds / gpu
    print(
        f"  {device} ({name})  {gpu:.2f} s median of {args.repeat} = {args.queries / gpu:,.0f} queries/s; "
        f"runs {', '.join(f'{t:.2f}' for t in gpu_times)} s; {search.searches} kernel calls, "
        f"{search.repeats} repeated, {search.rescored:,} pairs re-scored in float64"
    )
    print(f"  torch on the CPU ({torch.get_num_threads()} threads)  {cpu_seconds:.2f} s")
    print(f"  identical to FAISS's answer (ids and distances, bit for bit): {same_faiss} ({peer})")
    print(f"  identical to the torch CPU path: {same_cpu}")
    print(f"  speed: {ratio:.2f}x the CPU path ({'FAISS' if 'FAISS on' in (peer or '') else 'torch CPU'})")
    result = {
        "name": NAME,
        "device": name,
        **shape,
        "synthetic": True,
        "gpu_seconds": gpu_times,
        "cpu_torch_seconds": cpu_seconds,
        "peer": peer,
        "identical_to_faiss": same_faiss,
        "identical_to_cpu_torch": same_cpu,
        "ratio": ratio,
        "met": same_faiss is not False and same_cpu,
        "load_average": os.getloadavg(),
    }
    args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
