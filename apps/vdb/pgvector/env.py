"""PostgreSQL's server options, written once: the local server and the HPC ranks both start from them."""

from __future__ import annotations

from typing import Any

PASSWORD_FILE = "password"  # the superuser's password, beside the server (mode 0600); clients read it

# What each extension needs: the SQL that creates it, and a library preloaded at server start (or "").
EXTENSIONS = {
    "pgvector": ("CREATE EXTENSION IF NOT EXISTS vector", ""),
    "vectorchord": ("CREATE EXTENSION IF NOT EXISTS vchord CASCADE", "vchord"),
}


def server_gucs(settings: Any, listen: str, socket_dir: str) -> dict[str, str]:
    """``postgres -c`` settings of one server: ``listen`` is the TCP address ('' for none), ``socket_dir``
    the Unix socket directory ('' for none). Every value comes from validated settings (patterns, ranges)."""
    workers = settings.max_parallel_maintenance_workers
    gucs = {
        "listen_addresses": listen,
        "unix_socket_directories": socket_dir,
        "shared_buffers": settings.shared_buffers,
        "maintenance_work_mem": settings.maintenance_work_mem,
        "max_parallel_maintenance_workers": str(workers),
        # parallel index builds draw from these pools: room for the build and the query workers
        "max_worker_processes": str(max(8, workers + 4)),
        "max_parallel_workers": str(max(8, workers + 4)),
        "work_mem": settings.work_mem,
        "max_connections": str(settings.max_connections),
        "synchronous_commit": "on" if settings.synchronous_commit else "off",
        "dynamic_shared_memory_type": "posix",
        "logging_collector": "off",  # the log is the server's stderr: the deployment's log file
    }
    preload = EXTENSIONS[settings.extension][1]
    if preload:
        gucs["shared_preload_libraries"] = preload
    return gucs


def postgres_argv(postgres: str, data_dir: str, port: int, gucs: dict[str, str]) -> list[str]:
    """The ``postgres`` command line: data directory, port and one ``-c name=value`` per setting."""
    argv = [postgres, "-D", data_dir, "-p", str(port)]
    for name, value in gucs.items():
        argv += ["-c", f"{name}={value}"]
    return argv


def initdb_argv(initdb: str, data_dir: str, password_file: str) -> list[str]:
    """``initdb``: superuser ``postgres`` with the password in ``password_file``, SCRAM-SHA-256 for every
    connection (TCP and Unix socket: never ``trust``, since a superuser can run programs through ``COPY ... TO
    PROGRAM``), UTF-8, C locale."""
    return [
        initdb,
        "-D",
        data_dir,
        "-U",
        "postgres",
        "--auth=scram-sha-256",
        f"--pwfile={password_file}",
        "--encoding=UTF8",
        "--locale=C",
    ]
