"""Milvus's adapter: the deployment from :mod:`~apps.vdb.milvus.deploy`, the client from
:mod:`~apps.vdb.milvus.client`."""

from __future__ import annotations

from apps.vdb import Adapter
from apps.vdb.milvus.client import MilvusVectorClient
from apps.vdb.milvus.deploy import MilvusDeployment
from apps.vdb.milvus.settings import MilvusSettings

ADAPTER = Adapter(
    name="milvus", settings=MilvusSettings, deployment=MilvusDeployment, client=MilvusVectorClient
)
