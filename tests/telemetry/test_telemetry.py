"""Telemetry sampler and I/O-per-query probe on real processes doing real disk reads and CPU work."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import psutil
import pyarrow.parquet as pq
import pytest

from apps.evaluate.results import ResultRows, normalize_rows
from apps.report.telemetry import io_table, telemetry_section
from apps.telemetry.collector import DatabaseTelemetry
from apps.telemetry.sampler import (
    SERVER_PIDS,
    TELEMETRY_SCHEMA,
    Sampler,
    announce_engine,
    engine_pids,
    read_process,
    write_server_pids,
)
from apps.vdb.stages.query_io import QueryIo, io_columns, read_window
from core.store import write_parquet_atomic

# A worker that, for each line on stdin, reads ``path`` in 4 KiB read() calls (after asking the kernel
# to drop it from the page cache), burns some CPU, and answers "done". "exit" ends it.
WORKER = r"""
import os, sys
path = sys.argv[1]
with open(path, "wb") as fh:
    fh.write(os.urandom(4 << 20))
    fh.flush()
    os.fsync(fh.fileno())
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "exit":
        break
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    while os.read(fd, 4096):
        pass
    os.close(fd)
    sum(i * i for i in range(300_000))
    print("done", flush=True)
"""


class Worker:
    """A real child process doing disk reads and CPU work on request."""

    def __init__(self, directory: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(directory / "data.bin")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def work(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "done"

    def close(self) -> None:
        try:
            self.proc.stdin.write("exit\n")
            self.proc.stdin.flush()
            self.proc.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    w = Worker(tmp_path)
    try:
        yield w
    finally:
        w.close()


def _wait_rows(sampler: Sampler, n: int) -> None:
    """Until the sampler holds at least ``n`` rows (bounded, so a broken sampler fails, not hangs)."""
    deadline = time.monotonic() + 60
    while len(sampler.rows) < n:
        assert time.monotonic() < deadline, f"sampler took fewer than {n} samples in 60 s"
        time.sleep(0.05)


def test_sampler_records_reads_and_cpu_per_phase(worker: Worker, tmp_path: Path) -> None:
    out = tmp_path / "telemetry.parquet"
    sampler = Sampler(lambda: {"db": (worker.pid, "server")}, out, interval=0.2).start("insert")
    worker.work()
    _wait_rows(sampler, 3)
    sampler.set_phase("query")
    before = len(sampler.rows)
    worker.work()
    _wait_rows(sampler, before + 3)
    assert sampler.stop()["rows"] >= before + 3

    table = pq.read_table(out)
    assert table.schema.equals(TELEMETRY_SCHEMA, check_metadata=False)
    rows = table.to_pylist()
    assert {r["phase"] for r in rows} == {"insert", "query"}
    assert {(r["pid"], r["role"], r["process"], r["node"]) for r in rows} == {
        (worker.pid, "server", "db", socket.gethostname())
    }
    times = [r["time"] for r in rows]
    assert times == sorted(times) and len(set(times)) == len(times)
    for column in ("read_calls", "read_chars", "read_bytes", "write_bytes", "net_recv"):
        values = [r[column] for r in rows]
        assert values == sorted(values), f"{column} is cumulative and never falls"
    # Two passes of 4 MiB in 4 KiB read() calls: at least 2 x 1024 calls and 8 MiB read.
    assert rows[-1]["read_calls"] - rows[0]["read_calls"] >= 1024
    assert rows[-1]["read_chars"] - rows[0]["read_chars"] >= 4 << 20
    assert rows[0]["cpu_percent"] is None  # no interval yet
    assert any((r["cpu_percent"] or 0) > 0 for r in rows)
    assert all(r["rss_bytes"] > 0 and r["threads"] >= 1 for r in rows)


def test_sampler_thread_stops_when_the_phase_raises(worker: Worker, tmp_path: Path) -> None:
    out = tmp_path / "db" / "telemetry.parquet"
    sampler = Sampler(lambda: {"db": (worker.pid, "server")}, out, interval=0.1)
    with pytest.raises(RuntimeError, match="stage failed"), sampler:
        _wait_rows(sampler, 2)
        raise RuntimeError("stage failed")
    assert sampler._thread is not None and not sampler._thread.is_alive()
    assert pq.read_table(out).num_rows >= 2
    assert "telemetry" not in {t.name for t in threading.enumerate()}


def test_database_telemetry_never_raises_and_keeps_the_stage_error(
    worker: Worker, tmp_path: Path, caplog
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the database directory should be")
    telemetry = DatabaseTelemetry(blocker, lambda: {"db": worker.pid}, interval=0.1)
    with pytest.raises(ValueError, match="the stage's own error"):
        try:
            telemetry.start()
            telemetry.phase("insert")
            raise ValueError("the stage's own error")
        finally:
            telemetry.stop()  # cannot write under a file: logged, not raised
    assert "telemetry stop failed" in caplog.text
    assert not telemetry.sampler._thread.is_alive()


def test_in_process_engine_announces_itself_and_is_sampled(tmp_path: Path) -> None:
    data_dir = tmp_path / "server" / "engine-data"
    code = (
        "import sys; from apps.telemetry.sampler import announce_engine; announce_engine(sys.argv[1]); "
        "print('announced', flush=True); sys.stdin.readline()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(data_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "announced"
        assert engine_pids(data_dir) == [child.pid]
        assert engine_pids(data_dir, host="another-node") == []
        assert not data_dir.exists()  # the registry is beside the data directory, not inside it

        class Endpoints:
            in_process = True
            data_dir = str(tmp_path / "server" / "engine-data")

        db_dir = tmp_path / "db"
        db_dir.mkdir()
        telemetry = DatabaseTelemetry(db_dir, dict, interval=0.1)
        telemetry.start()
        telemetry.attach(Endpoints())
        telemetry.phase("query")
        telemetry.stop()
    finally:
        child.communicate("\n", timeout=30)
    rows = pq.read_table(db_dir / "telemetry.parquet").to_pylist()
    assert {(r["pid"], r["role"]) for r in rows if r["phase"] == "query"} == {(child.pid, "engine")}
    assert json.loads((db_dir / SERVER_PIDS).read_text())["pids"] == {}


def test_query_io_window_counts_the_server_reads_exactly(worker: Worker, tmp_path: Path) -> None:
    write_server_pids(tmp_path, {"db": worker.pid})
    probe = QueryIo(in_process=False, db_dir=tmp_path, page_cache="drop")
    probe.prepare()
    assert probe.state in ("cold", "warm") and (probe.state == "cold" or probe.state_note)
    with probe.window():
        worker.work()
    window = probe.last
    assert window is not None and window.processes == 1
    assert window.read_calls >= 1024 and window.read_chars >= 4 << 20
    assert window.peak_rss_bytes > 0

    # Into a raw file's metadata and back, then the per-query columns.
    path = tmp_path / "raw.parquet"
    import pyarrow as pa

    write_parquet_atomic(pa.table({"x": [1]}), path, metadata=probe.metadata(None))
    assert read_window(path) == window
    columns = io_columns({"queries_sent": 1024, "qps": 500.0}, window)
    assert columns["read_calls_per_query"] == window.read_calls / 1024
    assert columns["bytes_read_per_query"] == window.read_bytes / 1024
    assert columns["qps_per_gb"] == pytest.approx(500.0 / (window.peak_rss_bytes / 1e9))
    assert columns["page_cache"] == probe.state

    kept = QueryIo(in_process=False, db_dir=tmp_path, page_cache="keep")
    kept.prepare()
    assert (kept.state, kept.state_note) == ("warm", "page cache kept (vdb.query.page_cache: keep)")


def test_query_io_of_servers_on_another_node_is_null(tmp_path: Path) -> None:
    (tmp_path / SERVER_PIDS).write_text(json.dumps({"host": "compute-node-7", "pids": {"db": 1}}))
    probe = QueryIo(in_process=False, db_dir=tmp_path)
    probe.prepare()
    with probe.window():
        pass
    assert probe.last.processes == 0 and probe.last.read_bytes is None
    assert probe.last.page_cache == "warm" and "compute-node-7" in probe.last.page_cache_note
    assert probe.last.others_cpu_s is None  # the database's CPU is not known here: no neighbour told
    assert io_columns({"queries_sent": 10, "qps": 1.0}, probe.last)["bytes_read_per_query"] is None


def test_in_process_probe_reads_its_own_process(tmp_path: Path) -> None:
    announce_engine(tmp_path / "data")  # harmless here; the probe does not need it
    data = tmp_path / "blob"
    data.write_bytes(b"x" * (1 << 20))
    probe = QueryIo(in_process=True, db_dir=tmp_path, page_cache="keep")
    probe.prepare()
    with probe.window(), open(data, "rb", buffering=0) as fh:
        while fh.read(8192):
            pass
    assert probe.last.processes >= 1
    assert probe.last.read_calls >= 128 and probe.last.read_chars >= 1 << 20


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_query_io_window_tells_a_busy_neighbour_from_its_own_work(tmp_path: Path) -> None:
    """A process that is neither the database's nor this task's, busy during the window, is measured as
    other processes' load; this task's own CPU (the in-process engine and its clients) is not."""
    probe = QueryIo(in_process=True, db_dir=tmp_path, page_cache="keep")
    probe.prepare()
    with probe.window():
        _spin(1.0)
    own = probe.last.others_cpu_s / probe.last.window_s
    # The neighbour is orphaned at once (its shell exits): not a child of this process.
    shell = subprocess.run(
        ["sh", "-c", "sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    neighbour = psutil.Process(int(shell.stdout))
    try:
        assert neighbour.pid not in {c.pid for c in psutil.Process().children(recursive=True)}
        time.sleep(0.2)
        with probe.window():
            time.sleep(1.5)
    finally:
        neighbour.kill()
        neighbour.wait(timeout=10)
    busy = probe.last.others_cpu_s / probe.last.window_s
    assert busy >= 0.6 and own < busy - 0.5, (own, busy)
    assert probe.last.host_cpus == psutil.cpu_count()
    columns = io_columns({"queries_sent": 10, "qps": 1.0}, probe.last)
    assert columns["other_cpu_cores"] == pytest.approx(busy)


def test_a_setting_measured_beside_a_busy_neighbour_is_named_in_the_report(tmp_path: Path) -> None:
    from apps.report.document import write_report

    setting = {"stage": "query", "recall": 0.99, "qps": 100.0, "ef": 16, "k": 10, "batch_size": 1}
    rows = normalize_rows(
        [
            {"database": "faiss", "setting": "ef=16,batch=1,clients=1,k=10", **setting}
            | {"page_cache": "warm", "other_cpu_cores": 1.4},
            {"database": "qdrant", "setting": "ef=16,batch=1,clients=1,k=10", **setting}
            | {"page_cache": "warm", "other_cpu_cores": 0.1},
        ]
    )
    table = "\n".join(io_table(ResultRows(rows)))
    assert "| 1.40 |" in table and "| 0.10 |" in table
    write_report(rows, tmp_path / "report")
    text = " ".join((tmp_path / "report" / "report.md").read_text().split())
    assert "Measured beside a busy neighbour" in text
    assert "faiss ef=16,batch=1,clients=1,k=10 (1.4 cores)" in text
    assert "qdrant ef=16,batch=1,clients=1,k=10 (" not in text


def test_report_sections_from_real_telemetry(worker: Worker, tmp_path: Path) -> None:
    out = tmp_path / "telemetry.parquet"
    sampler = Sampler(lambda: {"db": (worker.pid, "server")}, out, interval=0.1).start("index")
    worker.work()
    _wait_rows(sampler, 3)
    sampler.set_phase("query")
    worker.work()
    _wait_rows(sampler, 6)
    sampler.stop()
    lines, figures = telemetry_section({"weaviate": out, "milvus": tmp_path / "absent.parquet"}, tmp_path)
    text = "\n".join(lines)
    assert "| " + socket.gethostname() + " | db | index |" in text
    assert "| " + socket.gethostname() + " | db | query |" in text
    assert "_milvus: no telemetry samples._" in text
    assert figures["telemetry_weaviate"].stat().st_size > 0

    rows = normalize_rows(
        [
            {"database": "weaviate", "stage": "query", "setting": "ef=16,batch=1,clients=1,k=10"}
            | {"recall": 0.9, "qps": 100.0, "page_cache": "cold", "bytes_read_per_query": 8192.0}
            | {"read_calls_per_query": 2.0, "peak_rss_bytes": 2**30, "qps_per_gb": 93.1, "ef": 16, "k": 10}
        ]
    )
    table = "\n".join(io_table(ResultRows(rows)))
    assert "On-disk footprint" not in table  # no database told index and data apart
    index = {"database": "weaviate", "stage": "index", "index_bytes": 2048, "data_bytes": 4096}
    rows.append(normalize_rows([index])[0])
    assert "| weaviate | 2.0 KiB | 4.0 KiB | — |" in "\n".join(io_table(ResultRows(rows)))
    expected = "| weaviate | ef=16,batch=1,clients=1,k=10 | 0.900 | 100.0 | cold | 8.0 KiB | 2.00 | 1.0 GiB |"
    assert expected in table


class _ExitingProcess:
    """What psutil shows of a process between releasing its memory and becoming a zombie: RSS 0."""

    pid = 4242

    def oneshot(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def cpu_times(self) -> SimpleNamespace:
        return SimpleNamespace(user=1.0, system=0.5)

    def create_time(self) -> float:
        return 1.0

    def memory_info(self) -> SimpleNamespace:
        return SimpleNamespace(rss=0)

    def num_threads(self) -> int:
        return 1

    def io_counters(self) -> SimpleNamespace:
        return SimpleNamespace(read_bytes=0, write_bytes=0, read_count=0, write_count=0)


def test_a_process_on_its_way_out_is_no_sample() -> None:
    """Sampled at teardown after its memory is gone, a server would show RSS 0: it is left out, as exited."""
    assert read_process(_ExitingProcess()) is None  # type: ignore[arg-type]
    assert read_process(psutil.Process())["rss_bytes"] > 0
