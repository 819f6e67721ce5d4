"""Weaviate's REST API with the deployment's API key (``Authorization: Bearer``), never through a proxy."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from apps.vdb.base import Endpoint
from apps.vdb.noproxy import urlopen
from apps.vdb.secret import endpoint_secret

KEY_FILE_ERROR = "weaviate: the API key file"


def node_key(node: Endpoint | None) -> str | None:
    """The API key of ``node`` from the file its endpoint names; None for a server reached without one."""
    return endpoint_secret(node, "api_key_file", KEY_FILE_ERROR)


def rest_json(url: str, key: str | None, timeout: float = 5.0, body: Any = None) -> Any:
    """GET ``url`` (PUT ``body`` as JSON when given) with the API key, and parse the JSON answer."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    request = urllib.request.Request(url, data, headers, method="GET" if body is None else "PUT")
    with urlopen(request, timeout=timeout) as resp:
        return json.load(resp)
