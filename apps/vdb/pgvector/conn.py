"""Connections to PostgreSQL (psycopg 3), shared by the deployment (health, extension) and the client."""

from __future__ import annotations

from typing import Any

from apps.vdb.base import DatabaseError, Endpoint
from apps.vdb.pgvector.env import EXTENSIONS
from apps.vdb.secret import read_secret, variable_secret


def endpoint_from_url(url: str) -> Endpoint:
    """The endpoint of an existing server named by a libpq URI (its password stays out of it)."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(url)
    host = str(parts.get("host") or "localhost")
    extra: dict[str, str | int] = {
        "dbname": str(parts.get("dbname") or "postgres"),
        "user": str(parts.get("user") or "postgres"),
    }
    return Endpoint(host=host, port=int(parts.get("port") or 5432), extra=extra)


def read_password(path: str) -> str:
    """The password in ``path`` (:func:`apps.vdb.secret.read_secret`: a plain file with one link, opened
    without following a symbolic link). The file's directory belongs to the server's user; a root client
    must not read whatever file that user could swap in (a link to a root-only file would be sent)."""
    return read_secret(path, "pgvector: the server's password file")


def connect(settings: Any, node: Endpoint, *, timeout: float = 10.0, autocommit: bool = True) -> Any:
    """A psycopg connection to ``node`` (TCP, or a Unix socket when its host is a directory).

    The password comes from the file the deployment wrote (``node.extra["password_file"]``: a started
    server, locally or on an HPC rank), else from the environment variable ``settings.password_env``.
    """
    import psycopg

    kwargs: dict[str, Any] = {
        "host": node.host,
        "port": node.port,
        "dbname": str(node.extra.get("dbname", "postgres")),
        "user": str(node.extra.get("user", "postgres")),
        "connect_timeout": max(1, int(timeout)),
        "application_name": "pes2o-vdb",
    }
    password_file = node.extra.get("password_file")
    if password_file:
        kwargs["password"] = read_password(str(password_file))
    elif settings.password_env:
        kwargs["password"] = variable_secret("pgvector: password_env", settings.password_env)
    return psycopg.connect(autocommit=autocommit, **kwargs)


def ensure_extension(conn: Any, extension: str) -> str:
    """Create the extension when missing (idempotent); its version. DatabaseError says what is missing."""
    import psycopg

    create, _ = EXTENSIONS[extension]
    try:
        with conn.transaction():
            # concurrent CREATE EXTENSION IF NOT EXISTS can still collide: serialise them
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('pes2o-vdb create extension'))")
            conn.execute(create)
    except psycopg.errors.FeatureNotSupported as exc:
        raise DatabaseError(f"pgvector: {create} failed: {exc}") from None
    except psycopg.errors.UndefinedFile as exc:
        raise DatabaseError(
            f"pgvector: the server has no {extension} extension ({exc}); use a server or image that ships it"
        ) from None
    name = "vchord" if extension == "vectorchord" else "vector"
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = %s", (name,)).fetchone()
    return str(row[0]) if row else "?"


def server_version(conn: Any) -> str:
    """'PostgreSQL 18.4' from ``server_version``."""
    return "PostgreSQL " + str(conn.execute("SHOW server_version").fetchone()[0]).split()[0]
