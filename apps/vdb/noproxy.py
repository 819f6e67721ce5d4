"""Database traffic never goes through an HTTP proxy.

ALCF compute nodes set ``http_proxy`` / ``https_proxy`` (and gRPC also reads ``grpc_proxy``) so that jobs
can reach the internet; a database on another compute node is not on the internet, and a request sent to
the proxy either fails or takes a detour through it. The servers never see these variables (``apptainer
exec --cleanenv``; their health checks use ``curl --noproxy '*'``); clients, which run in the user's
environment, bypass the proxy here:

* :func:`bypass_proxy` adds the database hosts to ``no_proxy`` / ``NO_PROXY`` of the client process before
  a client library opens a channel (urllib, httpx and gRPC all read them);
* :data:`GRPC_NO_PROXY` turns gRPC's proxy support off for a channel, where the library takes options;
* :func:`urlopen` is urllib without any proxy, for the adapters' own REST calls and health checks.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlparse

NO_PROXY_VARS = ("no_proxy", "NO_PROXY")
# gRPC channel argument: ignore http_proxy / https_proxy / grpc_proxy for this channel.
GRPC_NO_PROXY = {"grpc.enable_http_proxy": 0}

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # {}: no proxy, whatever the env


def bypass_proxy(hosts: Iterable[str | None]) -> None:
    """Add ``hosts`` (names, addresses or URLs) to this process's ``no_proxy`` and ``NO_PROXY``.

    Both variables end up with the same list (what either held, then ours), because libraries differ in
    which one wins when both are set.
    """
    wanted = [_host(h) for h in hosts if h]
    entries: list[str] = []
    for var in NO_PROXY_VARS:
        entries += [e.strip() for e in os.environ.get(var, "").split(",") if e.strip()]
    merged = ",".join(dict.fromkeys(entries + [h for h in wanted if h]))
    if merged:
        for var in NO_PROXY_VARS:
            os.environ[var] = merged


def _host(value: str) -> str:
    """The host of a URL (``http://node:19530`` -> ``node``), or ``value`` when it is a bare host."""
    return (urlparse(value).hostname or "") if "://" in value else value.strip()


def urlopen(request: str | urllib.request.Request, timeout: float) -> Any:
    """``urllib.request.urlopen`` that never uses a proxy (a response to use as a context manager)."""
    return _OPENER.open(request, timeout=timeout)
