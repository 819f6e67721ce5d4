"""ANN datasets in and out: the shared samples import with their published ground truth agreeing with the
project's exact search up to ties, a corrupted copy is reported, every export format round-trips, and bad
input is refused in one line with nothing left behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from apps import vecs
from apps.ann_export import EXPORT_FORMATS, export_dataset, locate
from apps.ann_import import import_dataset
from apps.dataset import iter_vectors
from core.errors import InputDataError
from core.store import complete_manifest
from pipeline.cli import app


def _base(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    parts = list(iter_vectors(directory))
    return np.concatenate([i for i, _ in parts]), np.concatenate([v for _, v in parts])


def _gt(directory: Path) -> np.ndarray:
    column = pq.read_table(directory / "groundtruth.parquet").column("neighbors").combine_chunks()
    return column.flatten().to_numpy().reshape(len(column), -1)


def _queries(directory: Path) -> np.ndarray:
    column = pq.read_table(directory / "queries.parquet").column("embedding").combine_chunks()
    return column.flatten().to_numpy().reshape(len(column), -1)


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def bigann(tmp_path_factory, shared_data: Path):
    """bigann10k imported once from its big-ann files (gt100.ibin: ids without distances)."""
    root = shared_data / "ann" / "bigann10k"
    store = tmp_path_factory.mktemp("store")
    files = [root / "base.10k.u8bin", root / "query.100.u8bin", root / "gt100.ibin"]
    return import_dataset("bin", files, "bigann10k", store), root


def test_bigann10k_published_ground_truth_agrees_up_to_ties(bigann) -> None:
    imported, root = bigann
    check = imported.check
    assert check["metric"] == "l2" and check["queries"] == 100 and check["k"] == 100
    assert check["disagree"] == 0 and check["agree_up_to_ties"] == 100
    assert check["identical"] < 100  # some lists differ only in the order of equal distances: ties are judged
    ids, base = _base(imported.directory)
    np.testing.assert_array_equal(ids, np.arange(10_000))
    np.testing.assert_array_equal(base, vecs.read_bin(root / "base.10k.u8bin"))
    np.testing.assert_array_equal(_gt(imported.directory), vecs.read_bin(root / "gt100.ibin"))
    np.testing.assert_array_equal(_queries(imported.directory), vecs.read_bin(root / "query.100.u8bin"))
    manifest = complete_manifest(imported.directory, checksums=True)
    assert manifest["stage"] == "embed" and manifest["rows"] == 10_000 and manifest["dimension"] == 128
    assert manifest["import"]["source_dtype"] == "uint8" and manifest["warnings"] == []
    assert (imported.directory / "README.md").read_text().startswith("# bigann10k")


def test_imported_dataset_reads_like_a_pipeline_one(bigann) -> None:
    """The readers the insert, query and report stages use accept it."""
    from apps.insert import work_units
    from apps.query_sweep import read_queries
    from apps.recall import read_groundtruth

    imported, _ = bigann
    assert len(work_units(str(imported.directory))) == 3  # 10,000 rows in row groups of 4096
    query_ids, queries = read_queries(str(imported.directory / "queries.parquet"), None)
    assert queries.shape == (100, 128)
    gt = read_groundtruth(imported.directory / "groundtruth.parquet")
    assert gt.column("query_id").to_pylist() == query_ids.tolist()


def test_fmnist1k_via_cli_agrees_and_a_second_import_is_reused(shared_data: Path, tmp_path: Path) -> None:
    folder = str(shared_data / "ann" / "fmnist1k")
    code, output = _cli("dataset", "import", "vecs", folder, "--name", "fmnist1k", "--workdir", str(tmp_path))
    assert code == 0, output
    assert "agrees with exact search up to ties: 500/500 queries" in output
    code, output = _cli(
        "dataset", "import", "fvecs", folder, "--name", "fmnist1k", "--workdir", str(tmp_path)
    )
    assert code == 0 and output.startswith("already imported")
    assert len(list((tmp_path / "store" / "datasets").iterdir())) == 1


def test_corrupted_groundtruth_is_reported(shared_data: Path, tmp_path: Path) -> None:
    root = shared_data / "ann" / "fmnist1k"
    bad = tmp_path / "fmnist1k_groundtruth.ivecs"
    gt = vecs.read_vecs(root / "fmnist1k_groundtruth.ivecs")
    gt[3, 5] = 999 if gt[3, 5] != 999 else 998  # a far row in the top 100
    gt[7, [0, 1]] = gt[7, [1, 0]]  # nearest two swapped: order matters where distances differ
    vecs.write_vecs(bad, [gt])
    args = [str(root / "fmnist1k_base.fvecs"), str(root / "fmnist1k_query.fvecs"), str(bad)]
    code, output = _cli("dataset", "import", "vecs", *args, "--name", "bad", "--workdir", str(tmp_path))
    assert code == 0, output
    assert f"warning: {bad}: published ground truth disagrees" in output
    assert "on 2 of 500 queries" in output and "query 3 position 5: published" in output
    (directory,) = (tmp_path / "store" / "datasets").iterdir()
    manifest = json.loads((directory / "manifest.json").read_text())
    check = manifest["import"]["groundtruth_check"]
    assert check["disagree"] == 2 and check["disagreeing_query_ids"] == [3, 7]
    assert check["first"][1]["position"] == 0 and manifest["warnings"]


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_export_round_trips(bigann, tmp_path: Path, fmt: str) -> None:
    imported, root = bigann
    out = tmp_path / fmt
    if fmt == "i8bin":  # bigann's values reach 255: int8 cannot hold them, and says so
        with pytest.raises(
            InputDataError, match=r"base\.i8bin: values are not all integers in \[-128, 127\]"
        ):
            export_dataset(locate(imported.directory), fmt, out)
        assert not out.exists() and not list(tmp_path.glob(".*.tmp"))
        return
    export_dataset(locate(imported.directory), fmt, out)
    if fmt == "bvecs":
        for mine, theirs in [
            ("base.bvecs", "bigann10k_base.bvecs"),
            ("query.bvecs", "bigann10k_query.bvecs"),
        ]:
            assert (out / mine).read_bytes() == (root / theirs).read_bytes()
        assert (out / "groundtruth.ivecs").read_bytes() == (root / "bigann10k_groundtruth.ivecs").read_bytes()
    if fmt == "u8bin":
        assert (out / "base.u8bin").read_bytes() == (root / "base.10k.u8bin").read_bytes()
        assert (out / "query.u8bin").read_bytes() == (root / "query.100.u8bin").read_bytes()
        ids, distances = vecs.read_ibin_groundtruth(out / "groundtruth.ibin")  # big-ann layout with distances
        np.testing.assert_array_equal(ids, vecs.read_bin(root / "gt100.ibin"))
        assert distances is not None and (np.diff(distances, axis=1) >= -1e-3).all()
    source = out / "bigann10k.hdf5" if fmt == "hdf5" else out
    again = import_dataset(fmt, [source], f"rt-{fmt}", tmp_path / "store")
    assert again.check["disagree"] == 0
    np.testing.assert_array_equal(_base(again.directory)[1], _base(imported.directory)[1])
    np.testing.assert_array_equal(_queries(again.directory), _queries(imported.directory))
    np.testing.assert_array_equal(_gt(again.directory), _gt(imported.directory))


def test_hdf5_angular_file_in_the_ann_benchmarks_layout(shared_data: Path, tmp_path: Path) -> None:
    root = shared_data / "ann" / "fmnist1k"
    base = vecs.read_vecs(root / "fmnist1k_base.fvecs")
    queries = vecs.read_vecs(root / "fmnist1k_query.fvecs")[:40]
    b = base / np.linalg.norm(base, axis=1, keepdims=True)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    distance = 1.0 - q.astype(np.float64) @ b.T.astype(np.float64)
    neighbors = np.argsort(distance, axis=1, kind="stable")[:, :10]
    path = tmp_path / "fmnist-angular.hdf5"
    with h5py.File(path, "w") as h5:
        h5.attrs["distance"] = "angular"
        h5.create_dataset("train", data=base)
        h5.create_dataset("test", data=queries)
        h5.create_dataset("neighbors", data=neighbors.astype(np.int32))
        h5.create_dataset("distances", data=np.take_along_axis(distance, neighbors, 1).astype(np.float32))
    imported = import_dataset("hdf5", [path], "fm-angular", tmp_path / "store")
    assert imported.manifest["metric"] == "cosine"
    assert imported.check["disagree"] == 0 and imported.check["queries"] == 40
    out = tmp_path / "export"
    export_dataset(locate(imported.directory), "hdf5", out)
    with h5py.File(out / "fm-angular.hdf5", "r") as h5:
        assert h5.attrs["distance"] == "angular"
        np.testing.assert_array_equal(h5["train"][:], base)
        np.testing.assert_array_equal(h5["test"][:], queries)
        np.testing.assert_array_equal(h5["neighbors"][:], neighbors)
        np.testing.assert_allclose(h5["distances"][:], np.take_along_axis(distance, neighbors, 1), atol=1e-5)
    with pytest.raises(InputDataError, match="declares metric cosine, --metric asks for l2"):
        import_dataset("hdf5", [path], "fm-l2", tmp_path / "store", metric="l2")


def test_pipeline_built_dataset_exports_with_its_ids(tmp_path: Path) -> None:
    """Ids shard * 10**9 + row: row-numbered formats map them (ids.npy), VectorDBBench keeps them."""
    from apps.dataset import finalize_dataset, row_id, vectors_to_arrow
    from apps.groundtruth import GroundTruthConfig, compute_groundtruth
    from core.store import write_parquet_atomic

    rng = np.random.default_rng(3)
    dataset, records, all_ids, all_vectors = tmp_path / "dataset", [], [], []
    for shard, rows in enumerate([40, 35]):
        ids = np.array([row_id(shard, r) for r in range(rows)], np.int64)
        vectors = rng.standard_normal((rows, 8)).astype(np.float32)
        table = pa.table({"id": ids, "embedding": vectors_to_arrow(vectors, "float32")})
        name = f"part-{shard:05d}.parquet"
        records.append({"file": name, "shard": shard, **write_parquet_atomic(table, dataset / name)})
        all_ids.append(ids)
        all_vectors.append(vectors)
    finalize_dataset(str(dataset), "k", records, {"dimension": 8, "dataset_name": "toy"}, {})
    queries = tmp_path / "queries" / "queries.parquet"
    query_vectors = rng.standard_normal((6, 8)).astype(np.float32)
    write_parquet_atomic(
        pa.table(
            {"id": np.arange(6, dtype=np.int64), "embedding": vectors_to_arrow(query_vectors, "float32")}
        ),
        queries,
    )
    compute_groundtruth(str(tmp_path / "gt"), str(dataset), str(queries), GroundTruthConfig(k=5, metric="l2"))
    code, output = _cli("dataset", "export", str(dataset), "fvecs", str(tmp_path / "none"))
    assert code == 3 and "name them with --queries and --groundtruth" in output
    code, output = _cli(
        "dataset", "export", str(dataset), "fvecs", str(tmp_path / "fvecs"),
        "--queries", str(queries.parent), "--groundtruth", str(tmp_path / "gt"),
    )  # fmt: skip
    assert code == 0, output
    ids, gt = (
        np.load(tmp_path / "fvecs" / "ids.npy"),
        vecs.read_vecs(tmp_path / "fvecs" / "groundtruth.ivecs"),
    )
    np.testing.assert_array_equal(ids, np.concatenate(all_ids))
    np.testing.assert_array_equal(ids[gt], _gt(tmp_path / "gt"))
    np.testing.assert_array_equal(
        vecs.read_vecs(tmp_path / "fvecs" / "base.fvecs"), np.concatenate(all_vectors)
    )
    export_dataset(locate(dataset, queries, tmp_path / "gt"), "vdbbench", tmp_path / "vdb")
    again = import_dataset("vdbbench", [tmp_path / "vdb"], "toy-vdb", tmp_path / "store")
    assert again.check["disagree"] == 0 and not again.manifest["import"]["ids_are_rows"]
    np.testing.assert_array_equal(_base(again.directory)[0], np.concatenate(all_ids))
    np.testing.assert_array_equal(_gt(again.directory), _gt(tmp_path / "gt"))


def _bad_inputs(shared: Path, tmp: Path) -> list[tuple[list[str], str]]:
    fm, bg = shared / "ann" / "fmnist1k", shared / "ann" / "bigann10k"
    truncated = tmp / "truncated_base.fvecs"
    truncated.write_bytes((fm / "fmnist1k_base.fvecs").read_bytes()[:-7])
    header = tmp / "short.u8bin"
    header.write_bytes((bg / "base.10k.u8bin").read_bytes()[:100_008])
    out_of_range = tmp / "gt.ivecs"
    gt = vecs.read_vecs(fm / "fmnist1k_groundtruth.ivecs")
    gt[2, 4] = 1000
    vecs.write_vecs(out_of_range, [gt])
    no_key = tmp / "nokey.hdf5"
    with h5py.File(no_key, "w") as h5:
        h5.create_dataset("train", data=np.zeros((4, 2), np.float32))
        h5.create_dataset("test", data=np.zeros((1, 2), np.float32))
    fmb, fmq, fmgt = (str(fm / f"fmnist1k_{r}") for r in ("base.fvecs", "query.fvecs", "groundtruth.ivecs"))
    bgq, bggt = str(bg / "query.100.u8bin"), str(bg / "gt100.ibin")
    return [
        (["vecs", str(truncated), fmq, fmgt], f"{truncated}: 3139993 bytes is not a whole number of rows"),
        (["bin", str(header), bgq, bggt], f"{header}: header says 10000x128"),
        (["vecs", fmb, str(bg / "bigann10k_query.bvecs"), fmgt], "queries have dimension 128, the base"),
        (["vecs", fmb, fmq, str(out_of_range)], f"{out_of_range}: 1 neighbour id(s) outside"),
        (["parquet", str(fm)], "unknown format 'parquet'"),
        (["hdf5", str(no_key)], f"{no_key}: no 'neighbors' dataset (found test, train)"),
        (["vecs", str(shared / "ann" / "siftsmall_partial")], "siftsmall_partial: no base file"),
    ]  # fmt: skip


def test_bad_input_is_one_line_and_leaves_nothing(shared_data: Path, tmp_path: Path) -> None:
    for args, message in _bad_inputs(shared_data, tmp_path):
        code, output = _cli("dataset", "import", *args, "--name", "bad", "--workdir", str(tmp_path / "w"))
        assert code == 3, output
        assert output.startswith("error: ") and output.count("\n") == 1 and message in output, output
        datasets = tmp_path / "w" / "store" / "datasets"
        assert not datasets.exists() or not list(datasets.iterdir())


def test_interrupted_import_leaves_no_dataset(shared_data: Path, tmp_path: Path, monkeypatch) -> None:
    """A failure after the parts are written (here in the check) removes the temp folder: no half dataset."""
    import apps.ann_import as ann_import

    def boom(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(ann_import, "compare_groundtruth", boom)
    with pytest.raises(RuntimeError):
        import_dataset("vecs", [shared_data / "ann" / "fmnist1k"], "fm", tmp_path)
    assert list((tmp_path / "datasets").iterdir()) == []
    shutil.rmtree(tmp_path / "datasets")


@pytest.mark.slow
def test_vdb_stages_run_on_an_imported_dataset(bigann, tmp_path: Path) -> None:
    """Insert, index, query sweep and recall (Qdrant's embedded engine) on imported bigann10k."""
    from apps.index import build_index
    from apps.insert import insert_partition, prepare_collection, work_units
    from apps.query_sweep import query_sweep
    from apps.recall import fetch_vectors, needed_base_ids, read_groundtruth, read_query_vectors, recall_at_k
    from apps.vdb.base import CollectionSpec
    from apps.vdb.config import QuerySweepConfig
    from apps.vdb.qdrant.deploy import QdrantDeployment
    from apps.vdb.qdrant.settings import QdrantSettings
    from apps.vdb.records import DatabaseTarget

    imported, _ = bigann
    directory = imported.directory
    settings = QdrantSettings(name="qdrant", mode="edge", indexing_threshold_kb=1, full_scan_threshold_kb=1)
    deployment = QdrantDeployment(settings)
    endpoints = deployment.start(tmp_path / "qdrant")
    try:
        spec = CollectionSpec(name="bigann", dim=128, metric=imported.manifest["metric"], index_type="hnsw")
        target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=spec)
        prepare_collection(target, False)
        insert_partition(target, work_units(str(directory)), 1000, 1, 0)
        index = build_index(target, 10_000, 300, None)
        sweep = QuerySweepConfig(ef=[128], batch_size=[10], clients=[1], k=[10], warmup_queries=0)
        (record,) = query_sweep(
            target, str(directory / "queries.parquet"), sweep, str(tmp_path / "out"), index
        )
    finally:
        deployment.stop()
    raw = pq.read_table(record.file)
    groundtruth = read_groundtruth(directory / "groundtruth.parquet")
    base = fetch_vectors(directory, needed_base_ids(raw, groundtruth, 10))
    recall, _ = recall_at_k(raw, groundtruth, read_query_vectors(directory / "queries.parquet"), base, "l2")
    assert raw.num_rows == 100 and recall >= 0.9, recall
