"""LanceDB (embedded) on bigann10k: every index type it builds, against the sample's exact ground truth."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from apps.interchange.vecs import read_vecs
from apps.vdb import database
from apps.vdb.base import SEARCH_KNOB, CollectionSpec, DatabaseError
from apps.vdb.config import VdbConfig
from apps.vdb.lancedb.checks import settings_problems
from apps.vdb.lancedb.settings import LanceDBSettings


@pytest.fixture(scope="module")
def bigann(shared_data: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Base vectors (10000x128, uint8 as float32), queries (100x128) and exact L2 neighbours (100x100)."""
    folder = shared_data / "ann" / "bigann10k"
    base = read_vecs(folder / "bigann10k_base.bvecs").astype(np.float32)
    queries = read_vecs(folder / "bigann10k_query.bvecs").astype(np.float32)
    truth = read_vecs(folder / "bigann10k_groundtruth.ivecs")
    return base, queries, truth


def recall_at(ids: np.ndarray, truth: np.ndarray, k: int = 10) -> float:
    """Mean |returned top-k ∩ exact top-k| / k."""
    return float(np.mean([len(set(r[:k]) & set(t[:k])) / k for r, t in zip(ids, truth, strict=True)]))


def spec(index_type: str, **kw: object) -> CollectionSpec:
    fields = {"name": "bigann", "dim": 128, "metric": "l2", "index_type": index_type, "ivf_nlist": 32} | kw
    return CollectionSpec(**fields)


@pytest.fixture
def lance(tmp_path: Path):
    """Deploy with the given settings into tmp_path/run and return a client; stopped afterwards."""
    started = []

    def _open(settings: LanceDBSettings | None = None):
        settings = settings or LanceDBSettings()
        adapter = database("lancedb")
        deployment = adapter.deployment(settings)
        started.append(deployment)
        endpoints = deployment.start(tmp_path / "run")
        return endpoints, adapter.client(settings, endpoints)

    yield _open
    for deployment in started:
        deployment.stop()


def load(client, base: np.ndarray, index_type: str, batch: int = 2500, **kw: object) -> None:
    client.create_collection(spec(index_type, **kw))
    for lo in range(0, len(base), batch):
        client.insert_new(np.arange(lo, lo + batch), base[lo : lo + batch])


def test_flat_is_exact_in_one_batched_request(lance, bigann) -> None:
    base, queries, truth = bigann
    endpoints, client = lance()
    assert endpoints.in_process and endpoints.server_version.startswith("lancedb ")
    load(client, base, "flat")
    client.build_index(timeout=60)  # compaction only
    assert client.count() == 10000 and client.describe().segments == 1
    result = client.search(queries, k=10, ef=None)
    assert result.ids.shape == (100, 10) and result.ids.dtype == np.int64
    assert recall_at(result.ids, truth) == 1.0
    # LanceDB's l2 score is the squared Euclidean distance, nearest first.
    want = ((base[truth[:, :10]] - queries[:, None, :]) ** 2).sum(axis=2)
    np.testing.assert_allclose(result.scores, want, rtol=1e-5)
    # One query and a batch of one give the same rows as the batch (the batch is one LanceDB query).
    single = client.search(queries[7:8], k=10, ef=None)
    np.testing.assert_array_equal(single.ids[0], result.ids[7])
    client.close()


def test_ivf_flat_nprobes_is_the_sweep_knob(lance, bigann) -> None:
    base, queries, truth = bigann
    _, client = lance()
    load(client, base, "ivf_flat")
    client.build_index(timeout=60)
    facts = client.describe()
    assert facts.details["index_type"] == "IVF_FLAT" and facts.details["indexed_rows"] == 10000
    assert facts.details["unindexed_rows"] == 0 and facts.details["index_bytes"] > 0
    one, all_lists = (recall_at(client.search(queries, 10, ef).ids, truth) for ef in (1, 32))
    assert one < 0.8 and all_lists >= 0.99  # one list of 32 misses neighbours; all lists find them


def test_ivf_pq_compresses_and_refine_recovers_recall(lance, bigann) -> None:
    base, queries, truth = bigann
    _, client = lance(LanceDBSettings(refine_factor=10))
    load(client, base, "ivf_pq", pq_m=16, pq_bits=8)
    client.build_index(timeout=120)
    facts = client.describe()
    assert facts.details["index_type"] == "IVF_PQ" and facts.details["indexed_rows"] == 10000
    # 16 one-byte codes per 512-byte vector: the index is far smaller than the data.
    assert 0 < facts.details["index_bytes"] < facts.details["data_bytes"] / 4
    assert facts.disk_bytes >= facts.details["data_bytes"] + facts.details["index_bytes"]
    assert recall_at(client.search(queries, 10, 16).ids, truth) >= 0.95


def test_ivf_pq_without_refine_is_approximate(lance, bigann) -> None:
    base, queries, truth = bigann
    _, client = lance()
    load(client, base, "ivf_pq", pq_m=16)
    client.build_index(timeout=120)
    recall = recall_at(client.search(queries, 10, 32).ids, truth)
    assert 0.5 < recall < 0.95  # PQ distances only: a real index, visibly lossy


def test_ivf_hnsw_sq_ef_is_the_sweep_knob(lance, bigann) -> None:
    base, queries, truth = bigann
    assert SEARCH_KNOB["ivf_hnsw_sq"] == "ef"
    _, client = lance(LanceDBSettings(nprobes=1))
    # One list: the HNSW graph spans every row, so ef alone decides how far a search looks.
    load(client, base, "ivf_hnsw_sq", ivf_nlist=1, hnsw_m=8, ef_construction=64)
    client.build_index(timeout=120)
    facts = client.describe()
    assert facts.details["index_type"] == "IVF_HNSW_SQ" and facts.details["indexed_rows"] == 10000
    narrow, wide = (recall_at(client.search(queries, 10, ef).ids, truth) for ef in (10, 400))
    assert narrow < wide and wide >= 0.95


def test_retried_batches_never_duplicate(lance, bigann) -> None:
    base = bigann[0]
    _, client = lance()
    load(client, base[:3000], "flat", batch=1000)
    ids = np.arange(1000, 2000)
    client.insert(ids, base[1000:2000])  # the retry of a batch that had landed
    client.insert(ids, base[1000:2000])
    assert client.count() == 3000
    # An upsert replaces the row: the moved vector is found at its new place, once.
    moved = np.full((1, 128), 1000.0, np.float32)  # far from every uint8 vector
    client.insert(np.array([5]), moved)
    assert client.count() == 3000
    hit = client.search(moved, k=3, ef=None)
    assert hit.ids[0, 0] == 5 and hit.scores[0, 0] == 0.0 and list(hit.ids[0]).count(5) == 1
    client.build_index(timeout=60)  # compaction drops the replaced rows' old versions
    assert client.count() == 3000 and client.describe().segments == 1


def test_data_lands_under_data_path_only(lance, bigann, tmp_path: Path) -> None:
    base, queries, truth = bigann
    ssd = tmp_path / "ssd"
    before = set(os.listdir(Path.cwd()))
    endpoints, client = lance(LanceDBSettings(medium="ssd", data_path=str(ssd)))
    assert Path(endpoints.data_dir).parent == ssd
    load(client, base, "ivf_flat")
    client.build_index(timeout=60)
    assert recall_at(client.search(queries, 10, 32).ids, truth) >= 0.99
    facts = client.describe()
    assert facts.details["medium"] == "ssd" and facts.details["data_dir"] == endpoints.data_dir
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files and all(ssd in p.parents for p in files)  # nothing in the run dir, nothing beside
    assert sum(p.stat().st_size for p in files) >= facts.details["data_bytes"] > base.nbytes * 0.9
    assert set(os.listdir(Path.cwd())) == before
    # A second attach finds the table; recreate drops it.
    client.create_collection(spec("ivf_flat"))
    assert client.count() == 10000
    client.create_collection(spec("ivf_flat"), recreate=True)
    assert client.count() == 0


def test_existing_table_with_another_dimension_or_metric(lance, bigann) -> None:
    _, client = lance()
    load(client, bigann[0][:100], "flat", batch=100)
    with pytest.raises(DatabaseError, match="exists with dimension 128 and metric l2, but dimension 64"):
        client.create_collection(spec("flat", dim=64))
    with pytest.raises(DatabaseError, match="metric cosine were requested"):
        client.create_collection(spec("flat", metric="cosine"))
    client.create_collection(spec("flat"))
    with pytest.raises(DatabaseError, match=r"vectors have shape \(2, 64\), collection dimension is 128"):
        client.insert(np.arange(2), np.zeros((2, 64), np.float32))


def test_unsupported_settings_fail_naming_the_field(lance) -> None:
    wrong = r"collection\.index_type\n  .hnsw. is not built by .*lancedb"
    with pytest.raises(ValidationError, match=wrong):
        VdbConfig(databases=[{"name": "lancedb"}], collection={"index_type": "hnsw"})
    _, client = lance()
    with pytest.raises(DatabaseError, match=r"vdb\.collection\.index_type 'diskann' is not built by LanceDB"):
        client.create_collection(spec("diskann"))
    with pytest.raises(DatabaseError, match=r"vdb\.collection\.pq_m 12 must divide the dimension 128"):
        client.create_collection(spec("ivf_pq", pq_m=12))
    with pytest.raises(DatabaseError, match=r"vdb\.collection\.quantization 'bq'"):
        client.create_collection(spec("ivf_hnsw_sq", quantization="bq"))
    with pytest.raises(ValidationError, match="medium 'ssd' needs data_path"):
        LanceDBSettings(medium="ssd")
    with pytest.raises(ValidationError, match="extra_forbidden"):
        LanceDBSettings(nprobe=3)


def test_hpc_check_wants_an_absolute_data_path() -> None:
    relative = LanceDBSettings(medium="ssd", data_path="scratch/lance")
    assert settings_problems(relative, 2, 1) == [
        (
            ("vdb", "databases", 2, "data_path"),
            "with vdb.cluster, lancedb's data_path must be absolute (clients run on other nodes)",
        )
    ]
    assert settings_problems(LanceDBSettings(medium="ssd", data_path="/local/scratch"), 0, 1) == []


def test_memory_medium_defaults_to_shm_and_is_removed_at_stop(tmp_path: Path) -> None:
    settings = LanceDBSettings(medium="memory")
    adapter = database("lancedb")
    deployment = adapter.deployment(settings)
    endpoints = deployment.start(tmp_path / "run")
    try:
        assert Path(endpoints.data_dir).parent == Path("/dev/shm")
        client = adapter.client(settings, endpoints)
        client.create_collection(spec("flat", dim=4))
        client.insert_new(np.arange(3), np.eye(3, 4, dtype=np.float32))
        assert client.count() == 3 and Path(endpoints.data_dir).is_dir()
        client.close()
    finally:
        deployment.stop()
    assert not Path(endpoints.data_dir).exists()


class _FolderFirst:
    """Resolves ``datasets`` from one folder only: the import a directory with a ``datasets/`` folder gets
    where Hugging Face's ``datasets`` is not installed (an empty namespace package)."""

    def __init__(self, folder: Path) -> None:
        self.folder = str(folder)

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        """The path finder's spec for ``datasets`` in the folder; None (not mine) for any other name."""
        import importlib.machinery

        return importlib.machinery.PathFinder.find_spec(name, [self.folder]) if name == "datasets" else None


def test_writes_survive_a_datasets_folder_loaded_as_a_module(lance, bigann, monkeypatch, tmp_path) -> None:
    """A folder named ``datasets/`` in the directory a user runs from imports as a namespace package (the
    current directory is on sys.path) where Hugging Face's ``datasets`` is not installed; LanceDB must not
    mistake it for Hugging Face's. The project installs that package, so a finder first on ``sys.meta_path``
    resolves ``datasets`` by the path alone, as Python does without it."""
    import importlib
    import sys

    (tmp_path / "cwd" / "datasets").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(tmp_path / "cwd"))
    monkeypatch.setattr(sys, "meta_path", [_FolderFirst(tmp_path / "cwd"), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "datasets", raising=False)
    assert not hasattr(importlib.import_module("datasets"), "Dataset")  # the folder, not Hugging Face's
    base = bigann[0]
    _, client = lance()
    load(client, base[:200], "flat", batch=100)
    assert client.count() == 200
    client.close()


def test_lancedb_imports_after_a_datasets_folder_was_loaded(tmp_path: Path) -> None:
    """A Parsl worker that embedded text first may have a ``datasets/`` folder of its directory loaded as a
    module (sentence-transformers imports ``datasets`` when it can) before LanceDB is first imported; LanceDB
    registers its Hugging Face converter at import time, so the client must drop it before importing."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "cwd" / "datasets").mkdir(parents=True)
    script = f"""
import sys, importlib.machinery, numpy as np
sys.path.insert(0, {str(repo)!r})
sys.path.insert(0, {str(tmp_path / "cwd")!r})
class FolderFirst:  # as without Hugging Face datasets installed: the folder on sys.path is the module
    find_spec = staticmethod(lambda name, path=None, target=None: importlib.machinery.PathFinder.find_spec(
        name, [{str(tmp_path / "cwd")!r}]) if name == "datasets" else None)
sys.meta_path.insert(0, FolderFirst)
import datasets
assert not hasattr(datasets, "Dataset") and "lancedb" not in sys.modules
from apps.vdb import database
from apps.vdb.base import CollectionSpec
from apps.vdb.lancedb.settings import LanceDBSettings
settings = LanceDBSettings()
adapter = database("lancedb")
deployment = adapter.deployment(settings)
endpoints = deployment.start(__import__("pathlib").Path({str(tmp_path / "run")!r}))
client = adapter.client(settings, endpoints)
client.create_collection(CollectionSpec(dim=4, metric="cosine", index_type="flat"))
client.insert_new(np.arange(3), np.eye(3, 4, dtype=np.float32))
print("rows", client.count())
deployment.stop()
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rows 3" in result.stdout
