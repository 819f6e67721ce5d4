"""Which Qdrant client a task gets: the embedded engine (edge) or qdrant-client against a server."""

from __future__ import annotations

from apps.vdb.base import Client, Endpoints
from apps.vdb.qdrant.edge import EdgeClient
from apps.vdb.qdrant.server import ServerClient
from apps.vdb.qdrant.settings import QdrantSettings


def connect(settings: QdrantSettings, endpoints: Endpoints, client_index: int = 0) -> Client:
    """Edge (in-process: one engine, any index) or a server client on peer ``client_index % peers``."""
    if settings.mode == "edge":
        return EdgeClient(settings, endpoints)
    return ServerClient(settings, endpoints, client_index)
