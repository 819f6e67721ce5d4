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

ROOT = Path(__file__).resolve().parents[2]
CLIENT_LIBRARIES = ("pymilvus", "milvus", "weaviate", "qdrant_client", "qdrant_edge", "faiss")
# Imported when a config is validated or an HPC job is planned: never a client library.
CONFIG_SIDE = ("settings", "env", "ranks", "checks")
# Only a database that can run as servers has an environment and ranks on a pilot job.
SERVER_PARTS = ("env", "ranks")


def in_process_only(name: str) -> bool:
    """A library that runs only inside its clients (``IN_PROCESS_ONLY`` in its settings): no server."""
    return bool(getattr(importlib.import_module(f"apps.vdb.{name}.settings"), "IN_PROCESS_ONLY", False))


def parts(name: str) -> tuple[str, ...]:
    """The config-side modules database ``name`` must have."""
    skip = SERVER_PARTS if in_process_only(name) else ()
    return tuple(p for p in CONFIG_SIDE if p not in skip)


@pytest.mark.parametrize("name", list(DATABASES))
def test_config_side_modules_import_no_client_library(name: str) -> None:
    modules = [f"apps.vdb.{name}.{part}" for part in parts(name)]
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
    assert {"adapter.py", "deploy.py", "client.py"} | {f"{p}.py" for p in parts(name)} <= set(sizes)
    assert max(sizes.values()) < 450, sizes
    assert sizes["adapter.py"] < 40  # it only assembles ADAPTER


def test_registry_reaches_every_part() -> None:
    assert client_packages() == [
        "weaviate-client",
        "pymilvus",
        "milvus",
        "qdrant-client",
        "qdrant-edge-py",
        "faiss-cpu",
    ]
    for name in DATABASES:
        assert get_adapter(name).name == name
        checks = cluster_checks(name)
        assert callable(checks.settings_problems) and callable(checks.cluster_problems)
    with pytest.raises(
        ValueError, match="unknown database 'pgvector'; known: faiss, milvus, qdrant, weaviate"
    ):
        cluster_checks("pgvector")


def test_each_database_picks_its_image_field() -> None:
    plain = DatabaseClusterConfig(images={"qdrant": "q.sif", "qdrant_gpu": "qg.sif", "milvus": "m.sif"})
    gpu = plain.model_copy(update={"gpu_indexing": True})
    servers = [n for n in DATABASES if not in_process_only(n)]  # a library has no image
    assert [cluster_image_field(n, plain) for n in servers] == ["weaviate", "milvus", "qdrant"]
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
