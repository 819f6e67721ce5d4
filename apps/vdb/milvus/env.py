"""Milvus's server environment, written once: the local standalone server and every HPC rank start from it."""

from __future__ import annotations

from typing import Any


def server_env(
    settings: Any, deploy_mode: str, extra: dict[str, str], metrics_port: int | None = None
) -> dict[str, str]:
    """``DEPLOY_MODE``, the caller's paths (``extra``), ``METRICS_PORT`` (also serves /healthz), then the
    user's ``env`` setting, which wins."""
    env = {"DEPLOY_MODE": deploy_mode, **extra}
    if metrics_port is not None:
        env["METRICS_PORT"] = str(metrics_port)
    return {**env, **settings.env}
