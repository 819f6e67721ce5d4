"""FAISS, the library baseline, on fmnist1k (real vectors, published exact L2 ground truth).

Each index type is loaded, indexed and queried, and its recall checked against the exact ground truth with
thresholds a broken index fails; the row store's retry and upsert rules; the index seen from a fresh
process; atomic index files; and the configurations FAISS refuses, naming the field.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from apps.interchange.vecs import read_vecs
from apps.vdb import database, runs_in_process
from apps.vdb.base import CollectionSpec, DatabaseError
from apps.vdb.faiss import build
from apps.vdb.faiss.settings import FaissSettings
from tests.conftest import SHARED, recall_at

DATA = SHARED / "ann" / "fmnist1k"
REPO = Path(__file__).resolve().parents[2]
# 1,000 rows: 16 lists; ivf_pq with 49 sub-vectors of 16 dimensions, 8 bits (256 codes, trained on all rows).
IVF = {"ivf_nlist": 16}
PQ = {"ivf_nlist": 16, "pq_m": 49, "pq_bits": 8}


def spec(index_type: str = "hnsw", metric: str = "l2", **kw: object) -> CollectionSpec:
    return CollectionSpec(name="fmnist", dim=784, metric=metric, index_type=index_type, **kw)


@pytest.fixture
def deploy(tmp_path: Path):
    """(endpoints, client factory) of a started deployment; always stopped."""
    adapter, settings = database("faiss"), FaissSettings(threads=1)
    deployment = adapter.deployment(settings)
    endpoints = deployment.start(tmp_path / "server")
    try:
        yield endpoints, lambda s=settings: adapter.client(s, endpoints)
    finally:
        deployment.stop()


def load(client, base: np.ndarray, batch: int = 250, first: int = 0) -> None:
    """Insert ``base`` in batches; row i gets id ``first + i``."""
    for lo in range(0, len(base), batch):
        client.insert(np.arange(first + lo, first + lo + batch, dtype=np.int64), base[lo : lo + batch])


def test_declared_as_a_library_run_inside_its_clients(deploy) -> None:
    endpoints, _ = deploy
    assert (
        endpoints.in_process and endpoints.nodes == [] and endpoints.server_version.startswith("faiss-cpu ")
    )
    assert database("faiss").index_types == ("hnsw", "ivf_flat", "ivf_pq", "flat")
    assert runs_in_process(FaissSettings())  # never a pilot job (VdbConfig.pilot_databases leaves it out)
    with pytest.raises(ValidationError, match="extra"):
        FaissSettings(nlist=4)


@pytest.mark.parametrize(
    ("index_type", "params", "low_ef", "low_floor", "high_ef", "high_floor"),
    [
        ("flat", {}, None, 1.0, None, 1.0),
        ("hnsw", {"hnsw_m": 16, "ef_construction": 128}, 10, 0.7, 64, 0.98),
        ("ivf_flat", IVF, 1, 0.6, 16, 1.0),  # every list probed: exact
        ("ivf_pq", PQ, 1, 0.55, 16, 0.8),  # PQ codes cap recall below 1
    ],
)
def test_index_type_load_index_query_recall(
    deploy, fmnist, index_type, params, low_ef, low_floor, high_ef, high_floor
) -> None:
    base, queries, truth = fmnist
    _, new_client = deploy
    client = new_client()
    client.create_collection(spec(index_type, **params))
    load(client, base)
    assert client.count() == 1000

    # Before the build the stored rows are searched exactly: the published ground truth and its distances.
    exact = client.search(queries[:50], k=10, ef=None)
    assert recall_at(exact.ids, truth[:50], 10) == 1.0
    squared = np.sum((base[truth[:50, :10]] - queries[:50, None, :]) ** 2, axis=2)
    np.testing.assert_allclose(exact.scores, squared, rtol=1e-4)

    client.build_index(timeout=120)
    stats = client.describe()
    assert stats.count == 1000 and stats.details["rows"] == 1000
    assert stats.details["index_type"] == index_type and stats.details["index_bytes"] > 0
    assert stats.disk_bytes >= stats.details["data_bytes"] >= base.nbytes
    index, built = client._index(client.spec)
    assert built == index_type and index.ntotal == 1000

    low = client.search(queries, k=10, ef=low_ef)
    high = client.search(queries, k=10, ef=high_ef)
    assert low.ids.shape == high.ids.shape == (500, 10) and high.ids.dtype == np.int64
    assert (high.ids >= 0).all() and not np.isnan(high.scores).any()
    low_recall, high_recall = recall_at(low.ids, truth, 10), recall_at(high.ids, truth, 10)
    assert high_recall >= high_floor and low_recall >= low_floor
    if index_type == "flat":
        np.testing.assert_array_equal(high.ids[:50], exact.ids)  # the built flat index is the exact scan
    else:  # the knob reaches the index: a narrower search finds less
        assert low_recall < high_recall
    client.close()


def test_cosine_and_inner_product(deploy, fmnist) -> None:
    base, queries, _ = fmnist
    _, new_client = deploy
    unit = base / np.linalg.norm(base, axis=1, keepdims=True)
    q_unit = queries[:100] / np.linalg.norm(queries[:100], axis=1, keepdims=True)
    cosine_truth = np.argsort(-(q_unit @ unit.T), axis=1, kind="stable")[:, :10]
    client = new_client()
    client.create_collection(CollectionSpec(name="cos", dim=784, metric="cosine", index_type="hnsw"))
    load(client, base)
    client.build_index(timeout=120)
    result = client.search(queries[:100], k=10, ef=64)
    assert recall_at(result.ids, cosine_truth, 10) >= 0.95
    # Scores are cosine similarities, whatever the vectors' lengths (queries are not normalised by us).
    want = np.einsum("qd,qkd->qk", q_unit, unit[result.ids])
    np.testing.assert_allclose(result.scores, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(base, read_vecs(DATA / "fmnist1k_base.fvecs"))  # inputs untouched

    ip = new_client()
    ip.create_collection(CollectionSpec(name="ip", dim=784, metric="ip", index_type="flat"))
    load(ip, base)
    ip.build_index(timeout=60)
    found = ip.search(queries[:20], k=5, ef=None)
    dots = queries[:20] @ base.T
    np.testing.assert_array_equal(found.ids, np.argsort(-dots, axis=1, kind="stable")[:, :5])
    np.testing.assert_allclose(found.scores, np.sort(dots, axis=1)[:, ::-1][:, :5], rtol=1e-5)


def test_retried_batch_never_duplicates_and_an_upsert_wins(deploy, fmnist) -> None:
    base, _, _ = fmnist
    endpoints, new_client = deploy
    client = new_client()
    client.create_collection(spec("flat"))
    load(client, base[:500])
    client.insert(np.arange(250, 500, dtype=np.int64), base[250:500])  # a retried batch
    rows = Path(endpoints.data_dir) / "fmnist" / "rows"
    assert len(list(rows.iterdir())) == 2 and client.count() == 500
    # Row 7 sent again in another batch with another vector: the newer copy is the one indexed.
    client.insert(np.array([7, 1000], dtype=np.int64), np.stack([base[900], base[901]]))
    assert client.count() == 501
    client.build_index(timeout=60)
    assert client.describe().details["rows"] == 501
    hit = client.search(base[900:901], k=2, ef=None)
    assert hit.ids[0, 0] == 7 and hit.scores[0, 0] == 0.0
    assert client.search(base[7:8], k=1, ef=None).ids[0, 0] != 7  # the old vector of 7 is gone


def test_insert_after_a_build_retires_the_index(deploy, fmnist) -> None:
    base, queries, truth = fmnist
    endpoints, new_client = deploy
    client = new_client()
    client.create_collection(spec("ivf_flat", **IVF))
    load(client, base[:750])
    client.build_index(timeout=60)
    assert client._index(client.spec)[1] == "ivf_flat"
    load(
        client, base[750:], first=750
    )  # no longer covered by the index: search is exact until the next build
    assert not (Path(endpoints.data_dir) / "fmnist" / build.INDEX_FILE).exists()
    index, kind = client._index(client.spec)
    assert kind == "flat" and index.ntotal == 1000
    assert recall_at(client.search(queries, k=10, ef=1).ids, truth, 10) == 1.0


def test_a_fresh_process_searches_the_built_index(deploy, fmnist) -> None:
    base, _, truth = fmnist
    endpoints, new_client = deploy
    client = new_client()
    client.create_collection(spec("hnsw"))
    load(client, base)
    client.build_index(timeout=120)
    client.close()
    code = f"""
import json, numpy as np
from apps.vdb import database
from apps.vdb.base import CollectionSpec, Endpoints
from apps.vdb.faiss.settings import FaissSettings
from apps.interchange.vecs import read_vecs
endpoints = Endpoints.model_validate_json({endpoints.model_dump_json()!r})
client = database("faiss").client(FaissSettings(threads=1), endpoints)
client.create_collection(CollectionSpec(name="fmnist", dim=784, metric="l2", index_type="hnsw"))
queries = read_vecs({str(DATA / "fmnist1k_query.fvecs")!r})
first = client.search(queries, 10, 64)
index, kind = client._index(client.spec)
again = client._index(client.spec)[0]
seen = {{"kind": kind, "ntotal": index.ntotal, "cached": index is again, "ids": first.ids.tolist()}}
print(json.dumps(seen))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True, timeout=120
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["kind"] == "hnsw" and seen["ntotal"] == 1000 and seen["cached"]
    assert recall_at(np.array(seen["ids"]), truth, 10) >= 0.98


def test_interrupted_index_write_never_leaves_a_readable_partial_index(deploy, fmnist, monkeypatch) -> None:
    import faiss

    base, queries, _ = fmnist
    endpoints, new_client = deploy
    directory = Path(endpoints.data_dir) / "fmnist"
    client = new_client()
    client.create_collection(spec("hnsw"))
    load(client, base)
    client.build_index(timeout=120)
    good = (directory / build.INDEX_FILE).read_bytes()
    before = client.search(queries[:20], 10, 32).ids

    real_write = faiss.write_index

    def write_half_then_die(index, name: str) -> None:
        real_write(index, name)
        data = Path(name).read_bytes()
        Path(name).write_bytes(data[: len(data) // 2])
        raise KeyboardInterrupt  # killed mid-write

    monkeypatch.setattr(faiss, "write_index", write_half_then_die)
    with pytest.raises(KeyboardInterrupt):
        client.build_index(timeout=120)
    monkeypatch.undo()
    assert (directory / build.INDEX_FILE).read_bytes() == good  # the previous index, whole
    assert [p.name for p in directory.iterdir() if p.name.endswith(".tmp")] == []
    np.testing.assert_array_equal(client.search(queries[:20], 10, 32).ids, before)

    # A half-written temp file of a writer killed outright is never taken as the index...
    stray = directory / f".{build.INDEX_FILE}.999.dead.tmp"
    stray.write_bytes(good[: len(good) // 3])
    (directory / build.INDEX_FILE).unlink()
    index, kind = client._index(client.spec)
    assert kind == "flat" and index.ntotal == 1000  # exact scan of the stored rows, not the stray file
    # ... and the next build removes it.
    client.build_index(timeout=120)
    assert not stray.exists() and client._index(client.spec)[1] == "hnsw"


@pytest.mark.parametrize(("index_type", "params"), [("ivf_pq", PQ), ("ivf_flat", IVF), ("hnsw", {})])
def test_on_disk_maps_the_index_file(deploy, fmnist, index_type, params) -> None:
    import faiss

    base, queries, truth = fmnist
    _, new_client = deploy
    client = new_client()
    client.create_collection(spec(index_type, on_disk=True, **params))
    load(client, base)
    client.build_index(timeout=120)
    index, _ = client._index(client.spec)
    inner = faiss.downcast_index(index.index)
    if index_type in build.IVF:  # inverted lists served from the mapped file
        assert isinstance(faiss.downcast_InvertedLists(inner.invlists), faiss.OnDiskInvertedLists)
    assert recall_at(client.search(queries, 10, 64).ids, truth, 10) >= (
        0.8 if index_type == "ivf_pq" else 0.98
    )


def test_bad_configurations_name_the_field(deploy, fmnist) -> None:
    base, _, _ = fmnist
    _, new_client = deploy
    client = new_client()
    with pytest.raises(DatabaseError, match=r"vdb\.collection\.pq_m = 10 does not divide the dimension 784"):
        client.create_collection(spec("ivf_pq", pq_m=10))
    with pytest.raises(DatabaseError, match=r"vdb\.collection\.quantization 'scalar'"):
        client.create_collection(spec("hnsw", quantization="scalar"))
    with pytest.raises(DatabaseError, match=r"vdb\.collection\.deferred_indexing"):
        client.create_collection(spec("hnsw", deferred_indexing=False))
    with pytest.raises(DatabaseError, match=r"vdb\.collection\.index_type .*not 'diskann'"):
        client.create_collection(spec("diskann"))
    with pytest.raises(DatabaseError, match=r"vdb\.collection\.shards to 1"):
        client.create_collection(spec("flat", shards=2))

    client.create_collection(spec("ivf_flat", ivf_nlist=64))
    load(client, base[:50], batch=50)
    with pytest.raises(DatabaseError, match=r"ivf_nlist = 64 lists need at least as many training rows.* 50"):
        client.build_index(timeout=60)
    other = new_client()
    with pytest.raises(DatabaseError, match=r"exists with dimension 784 .* dimension 128"):
        other.create_collection(CollectionSpec(name="fmnist", dim=128, metric="l2"))
    # An index of another type than the collection asks for is refused, not searched.
    client.create_collection(spec("flat"))
    client.build_index(timeout=60)
    client.create_collection(spec("hnsw"))
    with pytest.raises(DatabaseError, match=r"holds a flat index .* asks for hnsw.*run build_index"):
        client.search(base[:1], 1, 16)


def _dataset(base: np.ndarray, directory: Path) -> Path:
    """``base`` in the pipeline's dataset layout: 4 parts, row groups of 100 (40 work units)."""
    import pyarrow as pa

    from apps.dataset.layout import finalize_dataset, vectors_to_arrow
    from core.store import write_parquet_atomic

    records = []
    for shard in range(4):
        ids = np.arange(shard * 250, (shard + 1) * 250, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "doc_id": ids.astype(str),
                "chunk_index": np.zeros(250, np.int32),
                "embedding": vectors_to_arrow(base[ids], "float32"),
            }
        )
        name = f"part-{shard:05d}.parquet"
        written = write_parquet_atomic(table, directory / name, row_group_rows=100)
        records.append({"file": name, "shard": shard, **written})
    finalize_dataset(str(directory), "fmnist", records, {"dimension": 784}, {})
    return directory


def _in_subprocess(call: str, target, *args: object) -> object:
    """``call(target, *args)`` in a new Python process (another worker); its JSON-able result."""
    code = (
        "import json, sys\n"
        "from apps.vdb.records import DatabaseTarget\n"
        f"module, name = {call.rsplit('.', 1)!r}\n"
        "import importlib; fn = getattr(importlib.import_module(module), name)\n"
        "target = DatabaseTarget.model_validate_json(sys.argv[1])\n"
        "result = fn(target, *json.loads(sys.argv[2]))\n"
        "print(result.model_dump_json())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, target.model_dump_json(), json.dumps(list(args))],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_stages_in_different_processes(deploy, fmnist, tmp_path: Path) -> None:
    """insert (two workers, one in another process) -> searchable -> index (another process) -> query."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from apps.dataset.layout import vectors_to_arrow
    from apps.vdb.config import QuerySweepConfig
    from apps.vdb.records import DatabaseTarget, IndexRecord, InsertPart
    from apps.vdb.stages.insert import insert_partition, prepare_collection, wait_searchable, work_units
    from apps.vdb.stages.query_sweep import query_sweep
    from core.store import write_parquet_atomic

    base, queries, truth = fmnist
    endpoints, _ = deploy
    units = work_units(str(_dataset(base, tmp_path / "dataset")))
    target = DatabaseTarget(
        settings=FaissSettings(threads=1), endpoints=endpoints, collection=spec("ivf_flat", **IVF)
    )
    prepare_collection(target, False)
    mine = insert_partition(target, units[0::2], 64, 2, 0, worker=0)
    theirs = InsertPart(
        **_in_subprocess("apps.vdb.stages.insert.insert_partition", target, units[1::2], 64, 2, 0, 1)
    )
    assert mine.rows + theirs.rows == 1000 and mine.clients == theirs.clients == 1
    assert mine.visible_at is not None and theirs.visible_at is not None  # stored = searchable
    searchable = wait_searchable(target, 1000, 60, mine, theirs)
    assert searchable.count == 1000 and searchable.searchable_at == max(mine.visible_at, theirs.visible_at)

    index = IndexRecord(**_in_subprocess("apps.vdb.stages.index.build_index", target, 1000, 120, None))
    assert index.count == 1000 and index.disk_bytes > base.nbytes and index.write_amplification > 1

    path = tmp_path / "queries.parquet"
    table = {
        "id": np.arange(100),
        "text": [""] * 100,
        "embedding": vectors_to_arrow(queries[:100], "float32"),
    }
    write_parquet_atomic(pa.table(table), path)
    sweep = QuerySweepConfig(ef=[1, 16], batch_size=[100], clients=[3], k=[10], warmup_queries=0)
    records = query_sweep(target, str(path), sweep, str(tmp_path / "out"), index)
    assert [r.setting for r in records] == ["ef=1,batch=100,clients=1,k=10", "ef=16,batch=100,clients=1,k=10"]
    recalls = [
        recall_at(np.array(pq.read_table(r.file).column("ids").to_pylist()), truth[:100], 10) for r in records
    ]
    assert recalls[1] == 1.0 and recalls[0] < 0.95  # nprobe 16 of 16 lists is exact; 1 is not


def test_run_config_accepts_faiss_and_never_makes_it_a_pilot() -> None:
    from apps.vdb.cluster.config import DatabaseClusterConfig
    from apps.vdb.config import VdbConfig

    cfg = VdbConfig(
        databases=[{"name": "faiss", "threads": 2}, {"name": "qdrant", "mode": "server"}],
        collection={"index_type": "hnsw"},
        cluster=DatabaseClusterConfig(images={"qdrant": "q.sif"}),
    )
    assert [db.name for db in cfg.pilot_databases()] == ["qdrant"]  # faiss runs on the client block
    assert (
        VdbConfig(databases=[{"name": "faiss"}], collection={"index_type": "ivf_pq"}).databases[0].threads
        == 0
    )
    with pytest.raises(ValidationError, match=r"'diskann' is not built by vdb\.databases\[0\] \(faiss\)"):
        VdbConfig(databases=[{"name": "faiss"}], collection={"index_type": "diskann"})


@pytest.mark.slow
def test_pipeline_run_benchmarks_faiss_end_to_end(tmp_path: Path) -> None:
    """``python -m pipeline run`` with FAISS (ivf_flat): every stage through the CLI, into the report."""
    import pyarrow.parquet as pq
    import yaml

    from tests.conftest import base_config, run_cli, sample_records, write_jsonl

    corpus = write_jsonl(tmp_path / "c.jsonl", sample_records(60))
    vdb = {
        "databases": [{"name": "faiss", "threads": 1}],
        "collection": {"index_type": "ivf_flat", "ivf_nlist": 4},
        "insert": {"batch_sizes": [32, 128], "clients_per_worker": 2},
        "query": {
            "ef": [1, 4],
            "batch_size": [1, 8],
            "clients": [1, 2],
            "k": [10],
            "warmup_queries": 4,
            "duration_s": 0.5,  # the path, not the figures: a short window per setting (default 10 s)
        },
    }
    config = base_config(corpus, tmp_path / "wd", vdb=vdb)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_cli("run", str(path))
    assert result.returncode == 0, result.stderr[-4000:]
    (provenance,) = [json.loads(p.read_text()) for p in (tmp_path / "wd" / "runs").glob("*/provenance.json")]
    report = Path(provenance["outputs"]["vdb"]) / "report"
    rows = [r for r in pq.read_table(report / "results.parquet").to_pylist() if r["database"] == "faiss"]
    assert {r["stage"] for r in rows} >= {"insert", "index", "query"}
    queries = [r for r in rows if r["stage"] == "query"]
    assert {r["clients"] for r in queries} == {1} and len(queries) == 4  # one process: clients = 1
    best = max(r["recall"] for r in queries)
    assert best == 1.0  # nprobe 4 of 4 lists: exact
    assert "faiss" in (report / "report.md").read_text()


def test_clients_of_a_process_share_one_loaded_index_and_free_it(deploy, fmnist) -> None:
    import gc

    base, queries, _ = fmnist
    endpoints, new_client = deploy

    def loaded() -> int:  # indexes of this deployment the process holds
        return sum(key.startswith(endpoints.data_dir) for key, _ in build.LOADED.items)

    writer = new_client(FaissSettings(threads=1, fsync=True))  # fsync: same files, flushed to the device
    writer.create_collection(spec("hnsw"))
    load(writer, base)
    writer.build_index(timeout=120)
    first, second = new_client(), new_client()
    for client in (first, second):
        client.create_collection(spec("hnsw"))
        client.search(queries[:5], 10, 16)
    assert first._index(first.spec)[0] is second._index(second.spec)[0]  # loaded once
    assert loaded() == 1
    first.close()
    assert loaded() == 1  # still held by the second client
    second.close()
    gc.collect()
    assert loaded() == 0  # the last client closed: the memory is returned


def test_recreated_collection_forgets_the_cached_ids(deploy, fmnist) -> None:
    from apps.vdb.faiss import rows

    base, _, _ = fmnist
    endpoints, new_client = deploy
    client = new_client()
    client.create_collection(spec("flat"))
    load(client, base)
    assert client.count() == 1000
    client.create_collection(spec("flat"), recreate=True)  # the next upload of the insert sweep
    load(client, base[:500], batch=100)
    assert client.count() == 500
    cached = [k for k in rows._IDS if k[0].startswith(endpoints.data_dir)]
    assert len(cached) == 5  # only the files of the current upload


@pytest.mark.parametrize(("index_type", "params"), [("hnsw", {}), ("ivf_pq", {**PQ, "ivf_nlist": 4})])
def test_results_are_the_row_ids_sent(deploy, fmnist, index_type, params) -> None:
    base, _, _ = fmnist
    _, new_client = deploy
    client = new_client()
    client.create_collection(spec(index_type, **params))
    ids = 10**12 + 3 * np.arange(300, dtype=np.int64)[::-1]  # large, sparse, descending
    client.insert(ids[:150], base[:150])
    client.insert(ids[150:], base[150:300])
    client.build_index(timeout=60)
    found = client.search(base[[5, 200]], k=1, ef=64).ids[:, 0]
    np.testing.assert_array_equal(found, ids[[5, 200]])


@pytest.mark.parametrize("index_type", ["hnsw", "flat"])
def test_the_build_sizes_the_vector_storage_once(deploy, fmnist, monkeypatch, index_type: str) -> None:
    """FAISS grows a flat vector storage by doubling, each growth holding the old block beside a new one
    (up to two copies of the vectors at the build's peak): ``reserve_storage`` sizes it once, so chunked
    adds fill one block in place, and the index is the same; ``build_index`` reserves for every stored row."""
    import faiss

    base = fmnist[0]

    def chunked_build(reserve: bool) -> tuple[set[int], object]:
        index = build.new_index(spec(index_type))
        storage = build.vector_storage(index)
        if reserve:
            build.reserve_storage(index, len(base))
        blocks = set()
        for lo in range(0, len(base), 100):
            index.add_with_ids(base[lo : lo + 100], np.arange(lo, lo + 100))
            blocks.add(int(storage.codes.data()))
        assert storage.codes.size() == base.nbytes and index.ntotal == len(base)
        return blocks, index

    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # one thread: an HNSW build is then deterministic, so the two compare
    try:
        grown, plain = chunked_build(reserve=False)
        reserved, index = chunked_build(reserve=True)
    finally:
        faiss.omp_set_num_threads(threads)
    assert len(grown) > 1  # without it the storage moves as it grows: what the reservation prevents
    assert len(reserved) == 1
    np.testing.assert_array_equal(index.search(base[:20], 10)[1], plain.search(base[:20], 10)[1])

    calls = []
    monkeypatch.setattr(build, "reserve_storage", lambda idx, rows: calls.append(rows))
    client = deploy[1]()
    client.create_collection(spec(index_type))
    load(client, base)
    client.build_index(timeout=120)
    assert calls == [len(base)]
    client.close()
