"""LanceDB's adapter: an in-process deployment (a data directory) and the embedded client."""

from __future__ import annotations

from apps.vdb import Adapter
from apps.vdb.base import Client, Endpoints
from apps.vdb.lancedb.client import LanceDBClient
from apps.vdb.lancedb.deploy import LanceDBDeployment
from apps.vdb.lancedb.settings import LanceDBSettings


def _client(settings: LanceDBSettings, endpoints: Endpoints, client_index: int = 0) -> Client:
    """The embedded client (every client index opens the same table in its own process)."""
    return LanceDBClient(settings, endpoints)


ADAPTER = Adapter(name="lancedb", settings=LanceDBSettings, deployment=LanceDBDeployment, client=_client)
