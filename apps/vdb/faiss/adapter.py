"""FAISS's adapter: the library in the client process, sharing its collections through the data dir."""

from __future__ import annotations

from apps.vdb import Adapter
from apps.vdb.base import Client, Endpoints
from apps.vdb.faiss.client import FaissClient
from apps.vdb.faiss.deploy import FaissDeployment
from apps.vdb.faiss.settings import FaissSettings


def _client(settings: FaissSettings, endpoints: Endpoints, client_index: int = 0) -> Client:
    """A client on the collection directory (every client index reads the same files)."""
    return FaissClient(settings, endpoints)


ADAPTER = Adapter(name="faiss", settings=FaissSettings, deployment=FaissDeployment, client=_client)
