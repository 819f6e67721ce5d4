"""What a started database server really got: its CPU affinity, threads and listening sockets.

Read back from the running process (``/proc/<pid>/status`` through psutil) after the server is healthy, so
provenance records the affinity the kernel applied rather than the one the config asked for, and a server
that listens on every interface (a binary other than the project's patched build, or Milvus 2.3.5, which
has no setting for it) is named in a warning instead of going unnoticed.
"""

from __future__ import annotations

import logging

import psutil
from pydantic import BaseModel, ConfigDict

log = logging.getLogger(__name__)

WILDCARDS = frozenset({"0.0.0.0", "::", "*", ""})


class ServerFacts(BaseModel):
    """One server process (with its children) as the kernel sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    pid: int
    cpus_allowed: list[int]  # Cpus_allowed_list of the server process
    threads: int  # threads of the process and its children
    listeners: list[str]  # "address:port" of every listening TCP socket, sorted (UDP is not listed)
    wildcard: list[str]  # the listeners on an every-interface address


def listeners(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of ``pids`` and their descendants."""
    found = []
    for pid in pids:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                conns = proc.net_connections(kind="inet")
            except psutil.NoSuchProcess:
                if proc is root:
                    raise
                continue  # a child that exited meanwhile has no sockets left
            found += [(proc.pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return found


def _threads(proc: psutil.Process) -> int:
    try:
        return proc.num_threads()
    except psutil.NoSuchProcess:
        return 0


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def read_server_facts(name: str, pid: int) -> ServerFacts:
    """Affinity, threads and listeners of server ``name`` (process ``pid`` and its children)."""
    proc = psutil.Process(pid)
    with proc.oneshot():
        cpus = sorted(proc.cpu_affinity() or [])
        threads = proc.num_threads() + sum(_threads(c) for c in proc.children(recursive=True))
    socks = sorted({(ip, port) for _, ip, port in listeners([pid])}, key=lambda s: (s[1], s[0]))
    return ServerFacts(
        name=name,
        pid=pid,
        cpus_allowed=cpus,
        threads=threads,
        listeners=[_address(ip, port) for ip, port in socks],
        wildcard=[_address(ip, port) for ip, port in socks if ip in WILDCARDS],
    )


def observe_servers(database: str, pids: dict[str, int], why_wildcard: str = "") -> list[ServerFacts]:
    """Facts of each named server pid; a warning names any listener on every interface.

    ``why_wildcard`` is the database's own explanation when its server version cannot do otherwise.
    A process that exits meanwhile is left out (its failure is reported by the stage that needs it).
    """
    facts = []
    for name, pid in pids.items():
        try:
            fact = read_server_facts(name, pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied as exc:  # another user's process: nothing to record, say so once
            log.info("%s: cannot read server %s (pid %d): %s", database, name, pid, exc)
            continue
        if fact.wildcard:
            log.warning(
                "%s: server %s (pid %d) listens on every interface: %s%s",
                database,
                name,
                pid,
                ", ".join(fact.wildcard),
                f" ({why_wildcard})" if why_wildcard else " (reachable from other machines)",
            )
        facts.append(fact)
    return facts
