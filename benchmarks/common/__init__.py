"""Helpers shared by the benchmarks (not a benchmark itself: it has no ``__main__.py``).

* paths to the bundled sample, the output directory ``benchmarks/out/`` and the JSON writer;
* :class:`TreeSampler`: peak RSS summed over a process tree, sampled with psutil in a thread;
* :func:`write_corpus` and :func:`make_config`: a peS2o corpus cut from (or repeated from) the sample and a
  pipeline configuration over it with ``configs/local.yaml``'s chunking and embedding settings;
* :func:`prepare_chunks`: real chunk shards made by the project's own shard and chunk stages (cached in
  ``benchmarks/out/work/``, content-keyed like the pipeline's store);
* :func:`weaviate_connect`: the vendor side's Weaviate client.

What only the database benchmarks share is in :mod:`benchmarks.common.vdb`.
"""

from __future__ import annotations

import ctypes
import gzip
import json
import os
import platform
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "benchmarks" / "out"
SAMPLE = REPO / "datasets" / "pes2o-sample" / "s2ag-2k.jsonl.gz"
TERMS = REPO / "datasets" / "bvbrc-roles" / "functional_roles-2k.txt"
LOCAL_CONFIG = REPO / "configs" / "local.yaml"
# ../shared/data beside the clone (real corpora, ANN sets, the Qwen tokenizer), or where the variable says
SHARED_DATA = Path(os.environ.get("PIPELINE_SHARED_DATA", REPO.parent / "shared" / "data"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if hasattr(sys.stdout, "reconfigure"):  # stream reports line by line even into a pipe or a file
    sys.stdout.reconfigure(line_buffering=True)


def cores() -> int:
    """CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine() -> dict[str, Any]:
    """What the numbers were measured on (the JSON outputs carry it)."""
    return {
        "host": platform.node(),
        "cores": cores(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json(name: str, data: dict[str, Any]) -> Path:
    """Write the raw numbers of benchmark ``name`` to ``benchmarks/out/<name>.json``."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2, default=str) + "\n")
    return path


def mib(n_bytes: float) -> float:
    return n_bytes / 2**20


# --- memory of a process tree ----------------------------------------------------------------------------


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux PR_SET_CHILD_SUBREAPER).

    Parsl's LocalProvider starts the worker pool from a shell that exits at once, so without this the
    pool and its workers are re-parented to init and drop out of ``children(recursive=True)``.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER


def _reap_orphans(own: set[int]) -> None:
    """Collect adopted children that exited (leaving our own subprocess.Popen children alone)."""
    for child in psutil.Process().children():
        if child.pid in own:
            continue
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            pass


def role(proc: psutil.Process) -> str:
    """A short name for a process of a pipeline run: driver, interchange, worker pool, worker, ..."""
    cmd = " ".join(proc.cmdline())
    parent = proc.parent()
    if "resource_tracker" in cmd:
        return "mp resource tracker"
    if parent is not None and "process_worker_pool" in " ".join(parent.cmdline()):
        return "parsl worker"
    if "process_worker_pool" in cmd:
        return "parsl worker pool"
    if "interchange" in cmd:
        return "parsl interchange"
    if "-m pipeline" in cmd or "--arm" in cmd:
        return "driver"
    return (proc.name() or "?")[:24]


class TreeSampler:
    """Peak of the summed RSS of a process and all its descendants, sampled every ``interval`` seconds.

    Use as a context manager; ``root`` defaults to this process (``include_root=False`` leaves the root
    itself out: a benchmark driver measuring its children). With ``reap``, exited orphans adopted by a
    subreaper are collected, except ``own_children`` (pids this process waits for itself). ``timeline``
    keeps every sample as (unix time, [(pid, role, RSS bytes), ...]) for attributing memory to processes
    and stages afterwards.
    """

    def __init__(
        self,
        root: int | None = None,
        interval: float = 0.2,
        own_children: Iterable[int] = (),
        include_root: bool = True,
        reap: bool = False,
    ) -> None:
        self.root = psutil.Process(root or os.getpid())
        self.interval = interval
        self.own = set(own_children)
        self.include_root = include_root
        self.reap = reap
        self.peak = 0
        self.peak_processes = 0
        self.peak_breakdown: list[tuple[int, str, float]] = []  # (pid, role, MiB) at the peak
        self.timeline: list[tuple[float, list[tuple[int, str, int]]]] = []
        self._roles: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def tree(self) -> list[tuple[int, str, int]]:
        """(pid, role, RSS bytes) of every live process of the tree now."""
        try:
            procs = [self.root] if self.include_root else []
            procs += self.root.children(recursive=True)
        except psutil.Error:
            return []
        rows = []
        for proc in procs:
            try:
                rss = proc.memory_info().rss
                if proc.pid not in self._roles or self._roles[proc.pid] in ("bash", "sh", "python"):
                    self._roles[proc.pid] = role(proc)
                rows.append((proc.pid, self._roles[proc.pid], rss))
            except psutil.Error:
                pass
        return rows

    def sample(self) -> int:
        rows = self.tree()
        rss = sum(r[2] for r in rows)
        self.timeline.append((time.time(), rows))
        if rss > self.peak:
            self.peak, self.peak_processes = rss, len(rows)
            self.peak_breakdown = [(pid, name, round(mib(b), 1)) for pid, name, b in rows]
        return rss

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()
            if self.reap:
                _reap_orphans(self.own)

    def __enter__(self) -> TreeSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


# --- corpora, configurations and chunks ------------------------------------------------------------------


def sample_records(n: int) -> list[dict[str, Any]]:
    """The first ``n`` records of the bundled peS2o sample (2,000 real abstracts)."""
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as fh:
        records = [json.loads(line) for line, _ in zip(fh, range(n), strict=False)]
    if len(records) < n:
        raise SystemExit(f"the sample has only {len(records)} documents; asked for {n}")
    return records


def write_corpus(path: Path, docs: int, repeat: int = 1) -> Path:
    """A peS2o JSONL corpus: the first ``docs`` sample records, ``repeat`` times, ids made unique.

    Copy ``k`` of a record gets id ``<id>-r<k>`` (copy 0 keeps the original id), so a 10x corpus is the 1x
    corpus plus nine renamed copies and has exactly 10x the text.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    records = sample_records(docs)
    with open(path, "w", encoding="utf-8") as fh:
        for k in range(repeat):
            for record in records:
                copy = dict(record, id=str(record["id"]) if k == 0 else f"{record['id']}-r{k}")
                fh.write(json.dumps(copy) + "\n")
    return path


def local_settings() -> dict[str, Any]:
    """The ``chunking`` and ``embedding`` sections of ``configs/local.yaml``.

    The benchmarks follow the shipped configuration (model, dtype, max length, token budget, chunker), so
    a change there is what they measure next time.
    """
    data = yaml.safe_load(LOCAL_CONFIG.read_text())
    embedding = dict(data["embedding"])
    model = str(embedding["model"])
    if not model.startswith("pkg:") and not Path(model).expanduser().is_absolute():
        embedding["model"] = str((LOCAL_CONFIG.parent / model).resolve())
    return {"chunking": dict(data.get("chunking") or {"method": "none"}), "embedding": embedding}


def make_config(
    corpus: Path,
    workdir: Path,
    *,
    name: str = "bench",
    docs_per_shard: int = 250,
    chunking: dict[str, Any] | None = None,
    token_budget: int | None = None,
    torch_threads: int | None = None,
    workers: int = 2,
    queries: int | None = 500,
    k: int = 100,
    memory_budget_mb: int = 256,
) -> dict[str, Any]:
    """A run configuration over ``corpus`` with ``configs/local.yaml``'s chunking and embedding settings.

    ``chunking`` and ``token_budget`` replace the local ones when given.
    """
    local = local_settings()
    embedding = {**local["embedding"], "torch_threads": torch_threads}
    if token_budget is not None:
        embedding["token_budget"] = token_budget
    config: dict[str, Any] = {
        "name": name,
        "workdir": str(workdir),
        "corpus": {"format": "pes2o", "paths": [str(corpus)]},
        "sharding": {"docs_per_shard": docs_per_shard},
        "chunking": chunking or local["chunking"],
        "embedding": embedding,
        "dataset": {"name": f"{name}-dataset"},
        "groundtruth": {"k": k, "metric": "cosine", "memory_budget_mb": memory_budget_mb},
        "executor": {"platform": "local", "workers": workers},
    }
    if queries:
        config["queries"] = {
            "source": "terms",
            "terms_file": str(TERMS),
            "limit": queries,
            "instruction": False,
        }
    return config


def write_config(config: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def prepare_chunks(docs: int, docs_per_shard: int, chunking: dict[str, Any] | None = None):
    """Chunk shards of the first ``docs`` sample documents, made by the project's shard and chunk stages.

    Returns ``(plan, chunk_files)``. The work directory is ``benchmarks/out/work/chunks-<docs>``; the
    stages skip shards that are complete there, so a second call costs a second.
    """
    from apps.dataset import chunking as chunk_stage
    from apps.dataset import corpus as corpus_stage
    from pipeline.config.loader import load_config
    from pipeline.plan import build_plan

    work = OUT / "work" / f"chunks-{docs}"
    corpus = work / "corpus.jsonl"
    if not corpus.exists():
        write_corpus(corpus, docs)
    config = make_config(corpus, work, docs_per_shard=docs_per_shard, chunking=chunking, queries=None)
    plan = build_plan(load_config(write_config(config, work / "config.yaml")))
    cfg = plan.config
    shard_dir, chunk_dir = plan.stage("shard").directory, plan.stage("chunk").directory
    manifest = corpus_stage.shard_corpus(
        [str(p) for p in plan.corpus_files],
        cfg.corpus,
        cfg.sharding,
        str(shard_dir),
    )
    files = []
    for index, entry in enumerate(manifest["files"]):
        record = chunk_stage.chunk_shard(
            str(shard_dir / entry["file"]),
            str(chunk_dir),
            index,
            cfg.chunking,
            str(plan.tokenizer_dir),
            plan.embedding,
        )
        files.append(str(chunk_dir / record["file"]))
    return plan, files


def weaviate_connect(ctx: dict[str, Any]) -> tuple[Any, str]:
    """A weaviate-client v4 connection to the first node of ``ctx["endpoints_model"]``, and the class name
    of ``ctx["spec"]``: the vendor side of the ingest and query benchmarks. It sends the deployment's API
    key, read from the file the endpoint names (a server the project started refuses anonymous clients)."""
    import weaviate
    from weaviate.classes.init import AdditionalConfig, Auth, Timeout

    from apps.vdb.weaviate.client import class_name
    from apps.vdb.weaviate.rest import node_key

    node = ctx["endpoints_model"].nodes[0]
    key = node_key(node)
    client = weaviate.connect_to_custom(
        http_host=node.host,
        http_port=node.port,
        http_secure=False,
        grpc_host=node.host,
        grpc_port=node.grpc_port,
        grpc_secure=False,
        auth_credentials=Auth.api_key(key) if key else None,
        additional_config=AdditionalConfig(timeout=Timeout(init=30, query=120, insert=300)),
    )
    return client, class_name(ctx["spec"]["name"])
