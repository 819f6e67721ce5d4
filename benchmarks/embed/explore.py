"""``benchmarks.embed --explore``: the embedding knobs measured with plain processes on a subset."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks import common

# --- exploring the knobs with plain processes --------------------------------------------------------------


def _probe_process(
    kind: str, param: int, threads: int, variant: str, texts: list[str], cfg: dict, barrier, queue
) -> None:
    """One process of a probe: load, warm up, wait for the others, embed its texts, report CPU time."""
    from apps.dataset.embedding.loading import offline_environment

    offline_environment()
    import torch

    torch.set_num_threads(threads)
    if kind == "st":
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(cfg["model_dir"], device="cpu", local_files_only=True)
        model.max_seq_length = cfg["max_length"]

        def run(batch: list[str]) -> None:
            model.encode(batch, batch_size=param)
    else:
        from apps.dataset.embedding.model import Embedder

        backend, dtype = variant.split(":")
        update = {"torch_threads": threads, "token_budget": param, "backend": backend, "dtype": dtype}
        embedder = Embedder(cfg["embedding"].model_copy(update=update))

        def run(batch: list[str]) -> None:
            embedder.embed(batch, is_query=False)

    run(texts[:32])
    barrier.wait()
    cpu = time.process_time()
    run(texts)
    queue.put(time.process_time() - cpu)


def probe(
    kind: str, param: int, procs: int, threads: int, variant: str, texts: list[str], cfg: dict
) -> tuple[float, float]:
    """(chunks/s, chunks per CPU-second) of ``procs`` processes x ``threads`` threads sharing ``texts``
    (interleaved: an ideal split)."""
    import multiprocessing as mp
    import queue as queue_module

    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(procs + 1, timeout=600), ctx.Queue()
    workers = [
        ctx.Process(
            target=_probe_process, args=(kind, param, threads, variant, texts[i::procs], cfg, barrier, queue)
        )
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    try:
        barrier.wait()
        started = time.perf_counter()
        cpu: list[float] = []
        while len(cpu) < procs:
            try:
                cpu.append(queue.get(timeout=5))
            except queue_module.Empty:
                if any(w.exitcode not in (None, 0) for w in workers):
                    raise RuntimeError(f"a probe process failed ({kind} {param})") from None
        seconds = time.perf_counter() - started
    finally:
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.terminate()
    return len(texts) / seconds, len(texts) / sum(cpu)


def explore(texts: list[str], cfg: dict, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Throughput over backends x workers-by-threads splits, token budgets, and the baseline's batch size.

    Every setting is measured ``--explore-repeat`` times, the grid order reversed on every other pass so
    that a drifting background load does not favour one end of it; the median is reported.
    """
    cores = common.cores()
    subset = texts[:: max(1, len(texts) // args.explore_chunks)]  # every k-th chunk: same length mix
    splits = sorted({(1, cores), (cores, 1), (args.workers, max(1, cores // args.workers))})
    embedding = cfg["embedding"]
    configured = f"{embedding.backend}:{embedding.dtype}"
    grid = [("st", bs, 1, cores, "sentence-transformers:float32") for bs in args.explore_batch_sizes]
    grid += [("embedder", embedding.token_budget, p, t, v) for v in args.explore_backends for p, t in splits]
    own = (args.workers, max(1, cores // args.workers))
    grid += [("embedder", tb, *own, configured) for tb in args.explore_budgets]
    grid = list(dict.fromkeys(grid))  # the configured budget may appear twice
    rates: dict[tuple, list[tuple[float, float]]] = {setting: [] for setting in grid}
    print(
        f"\nexploring {len(grid)} settings x {args.explore_repeat} passes on {len(subset)} chunks "
        "(plain processes, interleaved split, model loaded before the clock):"
    )
    for repeat in range(args.explore_repeat):
        for setting in grid if repeat % 2 == 0 else grid[::-1]:
            rates[setting].append(probe(*setting, subset, cfg))
    rows = []
    for kind, param, procs, threads, variant in grid:
        runs = rates[(kind, param, procs, threads, variant)]
        rate = statistics.median(r[0] for r in runs)
        per_cpu = statistics.median(r[1] for r in runs)
        knob = f"batch_size={param}" if kind == "st" else f"token_budget={param}"
        label = "SentenceTransformer.encode" if kind == "st" else f"Embedder {variant}"
        spread = "/".join(f"{r[0]:.0f}" for r in runs)
        print(
            f"  {label:<34} {knob:<18} {procs} proc x {threads} thr  {rate:6.1f} chunks/s ({spread})  "
            f"{per_cpu:5.1f} chunks/CPU-s"
        )
        setting = {"kind": kind, "param": param, "procs": procs, "threads": threads, "variant": variant}
        rows.append({**setting, "chunks_per_s": rate, "chunks_per_cpu_s": per_cpu, "runs": runs})
    return rows
