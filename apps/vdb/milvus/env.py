"""Milvus's server environment, written once: the local standalone server and every HPC rank start from it.

Every server requires root's password (authorization on, :data:`AUTH_KEY`); the password is never in this
environment (HPC ranks write it to their env files): see :mod:`apps.vdb.milvus.deploy` for the local
server and :mod:`apps.vdb.milvus.ranks` for the image's, which reads :data:`ROOT_PASSWORD_VAR` at start.
"""

from __future__ import annotations

from typing import Any

from apps.vdb.base import Endpoint
from apps.vdb.secret import endpoint_secret, variable_secret

AUTH_KEY = "common.security.authorizationEnabled"  # milvus.yaml: every request needs a user's password
AUTH_VAR = "COMMON_SECURITY_AUTHORIZATIONENABLED"  # the same key as Milvus reads it from the environment
# Root's password when root is first created (2.4 and later; the HPC image), from the environment.
ROOT_PASSWORD_VAR = "COMMON_SECURITY_DEFAULTROOTPASSWORD"
ROOT = "root"
PASSWORD_FILE = "root-password"  # root's password in the deployment's (an HPC rank's: run) directory


def root_token(password: str) -> str:
    """The token pymilvus sends for root with ``password``."""
    return f"{ROOT}:{password}"


def node_token(node: Endpoint | None) -> str:
    """The token for a server this project started: root with the password in the file ``node`` names
    (``extra["password_file"]``); '' for a node that names none."""
    password = endpoint_secret(node, "password_file", "milvus: the root password file")
    return "" if password is None else root_token(password)


def external_token(settings: Any) -> str:
    """The credentials of a server given by ``uri``: the variable ``token_env`` names ('' without one)."""
    return variable_secret("milvus: token_env", settings.token_env) if settings.token_env else ""


def server_env(
    settings: Any, deploy_mode: str, extra: dict[str, str], metrics_port: int | None = None
) -> dict[str, str]:
    """``DEPLOY_MODE``, the caller's paths (``extra``), ``METRICS_PORT`` (also serves /healthz), then the
    user's ``env`` setting, which wins."""
    env = {"DEPLOY_MODE": deploy_mode, **extra}
    if metrics_port is not None:
        env["METRICS_PORT"] = str(metrics_port)
    return {**env, **settings.env}
