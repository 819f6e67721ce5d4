"""``benchmarks.embed``'s figures: padding of each side, agreement of the vectors, the closing table."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

COSINE_TOLERANCE = 1e-3  # vectors must agree to 1 - cos <= this


def baseline_padding(texts: list[str], model_dir: str, max_length: int, batch_size: int) -> dict[str, int]:
    """Real and padded tokens of ``encode(batch_size=...)``'s batches (it sorts by characters).

    A noise-free measure of the work each side does, next to the pipeline's own counters.
    """
    from apps.dataset.embedding.loading import load_tokenizer

    ids = load_tokenizer(model_dir)(texts, truncation=True, max_length=max_length)["input_ids"]
    lengths = np.array([len(i) for i in ids])
    order = np.argsort([-len(t) for t in texts], kind="stable")
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return {
        "tokens": int(lengths.sum()),
        "padded_tokens": int(sum(lengths[b].max() * len(b) for b in batches)),
    }


def agreement(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """How far two sets of row vectors are apart: the worst cosine and the largest element difference."""
    if a.shape != b.shape:
        return {"same_shape": False, "max_abs_diff": None, "min_cosine": None}
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosine = (a * b).sum(axis=1) / np.maximum(norms, 1e-12)
    return {"same_shape": True, "max_abs_diff": float(np.abs(a - b).max()), "min_cosine": float(cosine.min())}


def print_round(index: int, rounds: int, r: dict[str, Any]) -> None:
    base, pipe, agree = r["baseline"], r["pipeline"], r["agreement"]
    peers = "".join(
        f"; {kind} {r[kind]['chunks_per_s']:5.1f} chunks/s (min cosine {a['min_cosine']:.6f})"
        for kind, a in r["peer_agreement"].items()
    )
    print(
        f"round {index + 1}/{rounds} ({' then '.join(r['order'])}; load average {r['load_average']:.2f}): "
        f"baseline {base['chunks_per_s']:5.1f} chunks/s ({base['chunks']} in {base['seconds']:.1f} s, "
        f"{base['chunks_per_cpu_s']:.1f}/CPU-s), pipeline {pipe['chunks_per_s']:5.1f} chunks/s "
        f"({pipe['chunks']} in {pipe['seconds']:.1f} s, {pipe['chunks_per_cpu_s']:.1f}/CPU-s) -> "
        f"{r['ratio']:.2f}x ({r['cpu_ratio']:.2f}x per CPU-s); min cosine {agree['min_cosine']:.6f}{peers}",
        flush=True,
    )


def print_table(
    rounds: list[dict[str, Any]],
    memory: dict[str, Any],
    padding: dict[str, dict[str, int]],
    info: dict[str, Any],
) -> None:
    """Medians of every side with padding and memory, and each process's own peak RSS."""

    def median(kind: str, key: str) -> float:
        return statistics.median(r[kind][key] for r in rounds)

    def row(kind: str, setup: str) -> str:
        pad = padding[kind]["padded_tokens"] / padding[kind]["tokens"]
        return (
            f"{kind:<12}{median(kind, 'chunks_per_s'):>10.1f}{median(kind, 'chunks_per_cpu_s'):>14.1f}"
            f"{median(kind, 'seconds'):>11.1f}{pad:>13.3f}{memory[kind]['peak_rss_mib']:>14.0f}  {setup}"
        )

    base, pipe = info["baseline"], info["pipeline"]
    workers = pipe["workers"]
    print(
        f"\n{'':<12}{'chunks/s':>10}{'chunks/CPU-s':>14}{'seconds':>11}{'padded/real':>13}"
        f"{'peak RSS MiB':>14}  set-up (medians of {len(rounds)} rounds of {rounds[0]['baseline']['chunks']}"
        " chunks)"
    )
    print(row("baseline", f"1 process x {base['threads']} threads; model load {base['load_seconds']:.1f} s"))
    print(
        row(
            "pipeline",
            f"{len(workers)} workers x {sorted({w['threads'] for w in workers})} threads, "
            f"{workers[0]['backend']} {sorted({w['precision'] for w in workers})}, RSS summed over "
            f"{memory['pipeline']['peak_processes']} processes; Parsl start + model load (+ export if not "
            f"cached) {pipe['load_seconds']:.1f} s",
        )
    )
    for kind in [k for k in info if k.startswith("st-")]:
        backend = kind.removeprefix("st-")
        setup = f"SentenceTransformer(backend={backend!r}), 1 process x {info[kind]['threads']} threads"
        print(row(kind, f"{setup}; model load + export {info[kind]['load_seconds']:.1f} s"))
    for kind in info:
        procs = memory[kind]["per_process"]  # largest first
        shown = [p for p in procs[:4] if p["peak_rss_mib"] >= 100]
        rest = procs[len(shown) :]
        others = f"; {len(rest)} more processes, each <= {rest[0]['peak_rss_mib']:.0f} MiB" if rest else ""
        listed = ", ".join(f"{p['role']} {p['peak_rss_mib']:.0f} MiB" for p in shown)
        print(f"peak RSS per process, {kind}: {listed}{others}")
