"""Weaviate's adapter: the deployment from :mod:`~apps.vdb.weaviate.deploy`, the client from
:mod:`~apps.vdb.weaviate.client`."""

from __future__ import annotations

from apps.vdb import Adapter
from apps.vdb.weaviate.client import WeaviateClient
from apps.vdb.weaviate.deploy import WeaviateDeployment
from apps.vdb.weaviate.settings import WeaviateSettings

ADAPTER = Adapter(
    name="weaviate",
    settings=WeaviateSettings,
    deployment=WeaviateDeployment,
    client=WeaviateClient,
)
