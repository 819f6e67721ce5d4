"""Qdrant's adapter: the embedded engine ``qdrant-edge-py`` locally, ``qdrant-client`` against servers.

The deployment is in :mod:`~apps.vdb.qdrant.deploy`, the clients in :mod:`~apps.vdb.qdrant.edge` and
:mod:`~apps.vdb.qdrant.server`; ``settings.mode`` picks one.
"""

from __future__ import annotations

from apps.vdb import Adapter
from apps.vdb.base import Client, Endpoints
from apps.vdb.qdrant.deploy import QdrantDeployment
from apps.vdb.qdrant.edge import EdgeClient
from apps.vdb.qdrant.server import ServerClient
from apps.vdb.qdrant.settings import QdrantSettings


def _client(settings: QdrantSettings, endpoints: Endpoints, client_index: int = 0) -> Client:
    """Edge (in-process: one engine, any index) or a server client on peer ``client_index % peers``."""
    if settings.mode == "edge":
        return EdgeClient(settings, endpoints)
    return ServerClient(settings, endpoints, client_index)


ADAPTER = Adapter(name="qdrant", settings=QdrantSettings, deployment=QdrantDeployment, client=_client)
