"""Child server processes on this machine: free ports, own process group, logs, health, teardown.

Shared by the adapters that start real servers locally (Weaviate, Milvus, a ``qdrant`` binary).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from apps.vdb.base import DatabaseError
from apps.vdb.noproxy import urlopen
from core.lifetime import forget, record_group, start_watchdog

# Ports are chosen from here up to the kernel's ephemeral range. Below 10000 live well-known services;
# inside the ephemeral range, any outgoing connection (a cluster's ranks dialling each other among them)
# may take a chosen port as its source port between our pick and the server's bind.
FIRST_PORT = 10000


def ephemeral_floor() -> int:
    """The first port the kernel hands out to outgoing connections (Linux's default where unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bind_all(ports: Sequence[int], host: str) -> bool:
    """True when every port can be bound on ``host`` now (the sockets are held together, then closed)."""
    held: list[socket.socket] = []
    try:
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for sock in held:
            sock.close()


def free_port_block(count: int, host: str = "127.0.0.1", attempts: int = 500) -> int:
    """First of ``count`` consecutive ports that are free on ``host`` now, below the ephemeral range.

    The block starts at a random port, so two processes choosing at once rarely meet.
    """
    ceiling = ephemeral_floor()
    rng = random.SystemRandom()
    for _ in range(attempts if ceiling - FIRST_PORT >= count else 0):
        base = rng.randrange(FIRST_PORT, ceiling - count + 1)
        if _bind_all(range(base, base + count), host):
            return base
    raise DatabaseError(f"no {count} consecutive free ports on {host} between {FIRST_PORT} and {ceiling}")


def free_ports(n: int, host: str = "127.0.0.1", attempts: int = 500) -> list[int]:
    """``n`` distinct ports that are free on ``host`` now, below the ephemeral range (see FIRST_PORT)."""
    ceiling = ephemeral_floor()
    rng = random.SystemRandom()
    for _ in range(attempts if ceiling - FIRST_PORT >= n else 0):
        ports = rng.sample(range(FIRST_PORT, ceiling), n)
        if _bind_all(ports, host):
            return ports
    raise DatabaseError(f"no {n} free ports on {host} between {FIRST_PORT} and {ceiling}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now, below the ephemeral range."""
    return free_ports(1, host)[0]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something already listens on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def http_ok(url: str | urllib.request.Request, timeout: float = 2.0) -> bool:
    """True when GET ``url`` (or a prepared request, e.g. with an API key header) answers 2xx (never
    through an HTTP proxy: the server is ours)."""
    try:
        with urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def get_json(url: str, timeout: float = 5.0) -> Any:
    """GET ``url`` (no proxy) and parse the JSON answer (errors propagate: callers decide what it means)."""
    with urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


class ServerProcess:
    """One server process in its own process group, logging to ``log_path``.

    ``stop`` sends SIGTERM to the whole group, then SIGKILL after ``grace`` seconds, so
    helper processes a server forks (Milvus's embedded etcd, for example) die with it. A watchdog (its
    own session) stops the group when the process that started it dies, even by SIGKILL; inside a run
    the group is recorded so the next run in the workdir stops it if the watchdog could not.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        cpus: Sequence[int] | None = None,
    ) -> None:
        self.name = name
        self.cpus = None if cpus is None else sorted(cpus)  # CPU affinity of the server (None: inherited)
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.record: Path | None = None

    def start(self) -> None:
        """Launch the process (pinned to ``cpus`` when given); output goes to the log file."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        # Set in the child before exec: every thread the server starts inherits the affinity.
        pin = None if self.cpus is None else functools.partial(os.sched_setaffinity, 0, self.cpus)
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,  # own process group: one killpg stops everything it forks
                preexec_fn=pin,
            )
            self.watchdog = start_watchdog(self.proc.pid, self.name, log)
            self.record = record_group(self.name, self.proc.pid, self.proc.pid, self.watchdog.pid)
        except FileNotFoundError as exc:
            raise DatabaseError(f"{self.name}: cannot execute {self.argv[0]!r}: {exc}") from exc
        finally:
            log.close()

    def _release_watchdog(self) -> None:
        """The group is gone: end its watchdog (and reap it) and drop the record."""
        if self.watchdog is not None:
            if self.watchdog.poll() is None:
                self.watchdog.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.watchdog.wait(timeout=10)
            self.watchdog = None
        forget(self.record)
        self.record = None

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, check: Callable[[], bool], timeout: float, poll: float = 0.5) -> None:
        """Poll ``check`` until it is true; raise DatabaseError with the log tail on exit or timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise DatabaseError(
                    f"{self.name} exited with code {code} while starting; last lines of "
                    f"{self.log_path}:\n{tail(self.log_path)}"
                )
            if check():
                return
            time.sleep(poll)
        raise DatabaseError(
            f"{self.name} was not healthy after {timeout:.0f}s; last lines of {self.log_path}:\n"
            f"{tail(self.log_path)}"
        )

    def stop(self, grace: float = 15.0) -> None:
        """Terminate the process group (idempotent)."""
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    # A process stuck in the kernel (D state) may outlast even SIGKILL's wait: teardown
                    # must not raise over the stage's own error; the watchdog record is released below.
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.proc.wait(timeout=grace)
            # Children that outlived the leader (same group) are killed too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        finally:
            self._release_watchdog()

    def kill(self) -> None:
        """SIGKILL the whole group at once (fault-injection tests use this)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._release_watchdog()


def directory_bytes(path: Path, *, apparent: bool = False) -> int:
    """Bytes the files under ``path`` occupy on disk (allocated blocks), for write amplification.

    Allocated, not apparent, size by default: databases preallocate sparse files (Qdrant's 32 MB WAL
    segments), whose apparent size says nothing about what was written. ``apparent=True`` sums st_size.
    """
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                info = os.lstat(os.path.join(root, name))
                total += info.st_size if apparent else info.st_blocks * 512
    return total
