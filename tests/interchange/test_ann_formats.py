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

from apps.dataset.layout import iter_vectors
from apps.interchange import vecs
from apps.interchange.exporter import EXPORT_FORMATS, export_dataset, locate
from apps.interchange.importer import import_dataset
from core.errors import InputDataError
from core.store import complete_manifest
from pipeline.cli.main import app
from tests.conftest import REPO


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
    from apps.dataset.lookup import read_groundtruth
    from apps.vdb.stages.insert import work_units
    from apps.vdb.stages.query_sweep import read_queries

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
    assert "another metric" not in output  # 2 of 500: not a question of the metric


def test_a_metric_other_than_the_publishers_is_hinted_at(shared_data: Path, tmp_path: Path) -> None:
    """fmnist1k's lists are L2: imported as cosine, every list disagrees, and the warning asks."""
    root = str(shared_data / "ann" / "fmnist1k")
    args = ["vecs", root, "--name", "fmc", "--metric", "cosine", "--workdir", str(tmp_path)]
    code, output = _cli("dataset", "import", *args)
    assert code == 0, output
    said = " ".join(output.split())
    assert "on 500 of 500 queries" in said and "another metric (--metric ip or l2)?" in said, output


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


def _ann_hdf5(
    path: Path,
    distance_name: str,
    base: np.ndarray,
    queries: np.ndarray,
    neighbors: np.ndarray,
    distance: np.ndarray | None = None,
) -> Path:
    """An HDF5 file in ann-benchmarks' layout; with every query's ``distance`` to every base row, its
    neighbours' distances too."""
    with h5py.File(path, "w") as h5:
        h5.attrs["distance"] = distance_name
        h5.create_dataset("train", data=base)
        h5.create_dataset("test", data=queries)
        h5.create_dataset("neighbors", data=neighbors.astype(np.int32))
        if distance is not None:
            h5.create_dataset("distances", data=np.take_along_axis(distance, neighbors, 1).astype(np.float32))
    return path


def test_hdf5_angular_file_in_the_ann_benchmarks_layout(shared_data: Path, tmp_path: Path) -> None:
    root = shared_data / "ann" / "fmnist1k"
    base = vecs.read_vecs(root / "fmnist1k_base.fvecs")
    queries = vecs.read_vecs(root / "fmnist1k_query.fvecs")[:40]
    b = base / np.linalg.norm(base, axis=1, keepdims=True)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    distance = 1.0 - q.astype(np.float64) @ b.T.astype(np.float64)
    neighbors = np.argsort(distance, axis=1, kind="stable")[:, :10]
    path = _ann_hdf5(tmp_path / "fmnist-angular.hdf5", "angular", base, queries, neighbors, distance)
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
    from apps.dataset.groundtruth.stage import GroundTruthConfig, compute_groundtruth
    from apps.dataset.layout import finalize_dataset, row_id, vectors_to_arrow
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
    for command in (["export", str(tmp_path / "typo"), "fvecs", str(tmp_path / "out")], ["geometry", "typo"]):
        code, output = _cli("dataset", *command)  # a mistyped folder is not "an incomplete dataset"
        assert code == 3 and "typo: no such folder" in output and "not a complete" not in output, output
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
    with pytest.raises(InputDataError, match="computed with metric l2; --metric ip would relabel it"):
        locate(dataset, queries, tmp_path / "gt", metric="ip")  # the groundtruth stage recorded l2
    loose = tmp_path / "loose" / "groundtruth.parquet"  # no manifest beside it, none in the dataset
    loose.parent.mkdir()
    shutil.copy(tmp_path / "gt" / "groundtruth.parquet", loose)
    with pytest.raises(InputDataError, match="its metric is unknown"):
        locate(dataset, queries, loose)
    assert locate(dataset, queries, loose, metric="ip").metric == "ip"  # unknown: --metric names it
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
    zero_dim = tmp / "zero.fbin"
    zero_dim.write_bytes(np.array([1000, 0], "<u4").tobytes())
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
        (["bin", str(zero_dim), bgq, bggt], f"{zero_dim}: header says 1000x0: vectors of dimension 0"),
        (["bin", str(tmp), bgq, bggt], f"{tmp}: a folder; bin takes three files (base, queries, "),
        (["bin", str(zero_dim), bgq, str(tmp)], f"{tmp}: a folder; bin takes three files"),
        (["vecs", fmb, str(bg / "bigann10k_query.bvecs"), fmgt], "queries have dimension 128, the base"),
        (["vecs", fmq, fmb, fmgt], "1000 queries in " + fmb + " (the files are read as base, queries, "),
        (["vecs", fmb, fmq, str(out_of_range)], f"{out_of_range}: 1 neighbour id(s) outside"),
        (["parquet", str(fm)], "unknown format 'parquet'"),
        (["hdf5", str(no_key)], f"{no_key}: no 'neighbors' dataset (found test, train)"),
        (["hdf5", str(tmp / "absent.hdf5")], f"{tmp / 'absent.hdf5'}: no such file or directory"),
        (["hdf5", str(tmp)], f"{tmp}: a folder; hdf5 takes the ann-benchmarks .hdf5 file itself"),
        (["vecs", str(shared / "ann" / "siftsmall_partial")], "siftsmall_partial: no base file"),
        (["bin", str(fm)], "found nothing usable; its files look like format vecs"),
    ]  # fmt: skip


def test_bad_input_is_one_line_and_leaves_nothing(shared_data: Path, tmp_path: Path) -> None:
    for args, message in _bad_inputs(shared_data, tmp_path):
        code, output = _cli("dataset", "import", *args, "--name", "bad", "--workdir", str(tmp_path / "w"))
        assert code == 3, output
        assert output.startswith("error: ") and output.count("\n") == 1 and message in output, output
        datasets = tmp_path / "w" / "store" / "datasets"
        assert not datasets.exists() or not list(datasets.iterdir())
    # a name that would make a hidden folder (or `..-<key>`): no command could name it again
    fm = str(shared_data / "ann" / "fmnist1k")
    for name in (".hidden", "..", "a/b"):
        code, output = _cli("dataset", "import", "vecs", fm, "--name", name, "--workdir", str(tmp_path / "w"))
        assert code == 2 and f"--name {name!r}: use a letter or digit, then letters" in output, output
    assert not (tmp_path / "w" / "store" / "datasets").exists()


def test_files_under_a_study_datasets_name_must_have_its_dimension(tmp_path: Path) -> None:
    """GIST_DIR pointed at fmnist1k made a "gist-1m" of 1,000 x 784: refused by the card's dimension (a
    subset's name, yandex-t2i-10m, is the card's too); a name of the user's own making is not checked."""
    from apps.interchange.cards import remote_card

    fm = str(REPO / "datasets" / "ann" / "fmnist1k")
    expected = {
        "gist-1m": "but gist-1m's card (datasets/gist-1m.yaml) gives 960 dimensions",
        "Yandex-T2I-10M": "but 'Yandex-T2I-10M' names a subset of yandex-t2i, whose card "
        "(datasets/yandex-t2i.yaml) gives 200 dimensions",
    }
    for name, message in expected.items():
        code, output = _cli("dataset", "import", "vecs", fm, "--name", name, "--workdir", str(tmp_path / "w"))
        assert code == 3 and output.count("\n") == 1, output
        assert f"fmnist1k_base.fvecs: 784-dimensional vectors, {message}" in output
    assert not (tmp_path / "w" / "store").exists()  # refused before the store is made
    for own in ("pes2o-ve-minilm", "gistx", "gist-1m-pca128", "dbpedia-openai-1m-512", "gist-1m-sample"):
        assert remote_card(own) is None, own  # built, no card, or a variant of the user's own
    code, output = _cli(
        "dataset", "import", "vecs", fm, "--name", "gist-like", "--workdir", str(tmp_path / "w")
    )
    assert code == 0, output


def test_a_study_name_on_another_row_count_is_warned_of(shared_data: Path, tmp_path: Path) -> None:
    """1,000 rows imported as yandex-t2i-10m import (the vectors are the user's), with a warning that the
    name promises 10M. Real data cut to fit: fmnist1k's first 200 coordinates stand in for Yandex's 200."""
    from apps.interchange.cards import card_rows_note

    root = shared_data / "ann" / "fmnist1k"
    base = vecs.read_vecs(root / "fmnist1k_base.fvecs")[:, :200]
    queries = vecs.read_vecs(root / "fmnist1k_query.fvecs")[:20, :200]
    distance = ((queries[:, None, :].astype(np.float64) - base[None, :, :]) ** 2).sum(-1)
    neighbors = np.argsort(distance, axis=1, kind="stable")[:, :10]
    path = _ann_hdf5(tmp_path / "yandex-like.hdf5", "euclidean", base, queries, neighbors)
    args = ("dataset", "import", "hdf5", str(path), "--workdir", str(tmp_path / "w"))
    code, output = _cli(*args, "--name", "yandex-t2i-10m")
    said = " ".join(output.split())
    assert code == 0 and "1,000 base vectors, but its name 'yandex-t2i-10m' gives 10,000,000" in said, output
    assert "e.g. yandex-t2i-1k" in said
    # said once, before the rows are read (a user who named the wrong files can stop), and kept
    assert said.count("base vectors, but") == 1 and said.index("base vectors, but") < said.index("imported:")
    (manifest,) = (tmp_path / "w" / "store" / "datasets").glob("yandex-t2i-10m-*/manifest.json")
    assert any("gives 10,000,000" in line for line in json.loads(manifest.read_text())["warnings"])
    code, output = _cli(*args, "--name", "yandex-t2i-1k")  # the name that says what it holds
    assert code == 0 and "base vectors, but" not in output, output
    assert "gist-1m's card (datasets/gist-1m.yaml) gives 1,000,000" in str(
        card_rows_note("gist-1m", 2000, "f")
    )
    assert card_rows_note("dbpedia-openai-1m", 990_000, "f") is None  # its HDF5 split's train rows
    assert "more than dbpedia-openai-1m's card" in str(card_rows_note("dbpedia-openai-1m", 10**7, "f"))
    assert str(card_rows_note("gist-1m-1500k", 10**6, "f")).endswith("e.g. gist-1m)")  # the whole set
    assert card_rows_note("my-gist", 5, "f") is None  # the user's own name
    assert card_rows_note("gist-1m-0k", 5, "f") is None  # no count of rows: the user's own name too


def test_cards_a_user_is_drafting_or_an_installed_wheel_check_what_they_can(tmp_path: Path) -> None:
    """A card that is not a YAML mapping is passed over, not a traceback at `validate`; with no cards
    folder (an installed wheel) nothing is checked."""
    from apps.interchange.cards import remote_card

    (tmp_path / "draft.yaml").write_text("name: [gist-1m\n")  # unclosed: not YAML
    (tmp_path / "list.yaml").write_text("- gist-1m\n")
    (tmp_path / "gist-1m.yaml").write_text("name: gist-1m\nkind: remote\ndims: 960\n")
    card = remote_card("gist-1m-10k", tmp_path)
    assert card is not None and card.dims == 960 and card.path.name == "gist-1m.yaml"
    assert remote_card("gist-1m", None) is None


def test_interrupted_import_leaves_no_dataset(shared_data: Path, tmp_path: Path, monkeypatch) -> None:
    """A failure after the parts are written (here in the check) removes the temp folder: no half dataset."""
    import apps.interchange.importer as ann_import

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
    from apps.dataset.lookup import fetch_vectors, read_groundtruth, read_query_vectors
    from apps.evaluate.recall import needed_base_ids, recall_at_k
    from apps.vdb.base import CollectionSpec
    from apps.vdb.config import QuerySweepConfig
    from apps.vdb.qdrant.deploy import QdrantDeployment
    from apps.vdb.qdrant.settings import QdrantSettings
    from apps.vdb.records import DatabaseTarget
    from apps.vdb.stages.index import build_index
    from apps.vdb.stages.insert import insert_partition, prepare_collection, work_units
    from apps.vdb.stages.query_sweep import query_sweep

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
        sweep = QuerySweepConfig(
            ef=[128], batch_size=[10], clients=[1], k=[10], warmup_queries=0, duration_s=None
        )
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


# --- hostile input: one line, the documented exit code, nothing left behind ------------------------------


def _one_line(code: int, output: str, expected_code: int, message: str) -> None:
    assert code == expected_code, output
    assert output.startswith("error: ") and output.count("\n") == 1 and message in output, output


def _leftovers(store: Path) -> list[Path]:
    datasets = store / "datasets"
    return list(datasets.iterdir()) if datasets.exists() else []


@pytest.mark.parametrize(("role", "row"), [("base", 500), ("query", 3)])
def test_a_row_of_another_dimension_is_one_line(
    shared_data: Path, tmp_path: Path, role: str, row: int
) -> None:
    """The size is whole rows, but one row's own dimension says 7: found while reading, named by row."""
    folder = tmp_path / "fm"
    shutil.copytree(shared_data / "ann" / "fmnist1k", folder)
    damaged = folder / f"fmnist1k_{role}.fvecs"
    damaged.chmod(0o644)
    with open(damaged, "r+b") as fh:
        fh.seek(row * (4 + 784 * 4))
        fh.write(np.int32(7).tobytes())
    code, output = _cli("dataset", "import", "vecs", str(folder), "--name", "fm", "--workdir", str(tmp_path))
    _one_line(code, output, 3, f"{damaged}: row {row} has dimension 7, expected 784")
    assert _leftovers(tmp_path / "store") == []


@pytest.mark.parametrize(("role", "row", "value"), [("base", 700, np.nan), ("query", 5, np.inf)])
def test_a_row_holding_nan_or_infinity_is_one_line(
    shared_data: Path, tmp_path: Path, role: str, row: int, value: float
) -> None:
    """A non-finite element makes every distance to its row undefined: refused, naming the file and row."""
    folder = tmp_path / "fm"
    shutil.copytree(shared_data / "ann" / "fmnist1k", folder)
    damaged = folder / f"fmnist1k_{role}.fvecs"
    damaged.chmod(0o644)
    with open(damaged, "r+b") as fh:
        fh.seek(row * (4 + 784 * 4) + 4 + 100 * 4)  # element 100 of the row
        fh.write(np.float32(value).tobytes())
    code, output = _cli("dataset", "import", "vecs", str(folder), "--name", "fm", "--workdir", str(tmp_path))
    _one_line(code, output, 3, f"{damaged}: {role} row {row} (0-based) holds NaN or an infinite value")
    assert not (tmp_path / "store").exists()  # found while streaming: the store made for it is removed


def test_an_interrupted_import_leaves_the_workdir_as_it_was(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the base streams: the staged folder and the store folders made for it are removed."""
    from apps.interchange import importer

    def interrupted(target, out: Path, *args, **kwargs):
        (out / "base-00000.parquet").write_bytes(b"half a part")
        raise KeyboardInterrupt

    monkeypatch.setattr(importer, "_build", interrupted)
    folder = str(shared_data / "ann" / "fmnist1k")
    code, _ = _cli("dataset", "import", "vecs", folder, "--name", "fm", "--workdir", str(tmp_path))
    assert code != 0
    assert not (tmp_path / "store").exists()


def test_a_damaged_import_is_refused_not_reused(shared_data: Path, tmp_path: Path) -> None:
    folder = str(shared_data / "ann" / "fmnist1k")
    args = ["dataset", "import", "vecs", folder, "--name", "fm", "--workdir", str(tmp_path)]
    code, output = _cli(*args)
    assert code == 0, output
    (directory,) = _leftovers(tmp_path / "store")
    with open(directory / "groundtruth.parquet", "r+b") as fh:
        fh.truncate(100)  # what `truncate -s 100` does
    code, output = _cli(*args)
    _one_line(code, output, 4, f"{directory} holds a damaged or incomplete dataset")
    assert "groundtruth.parquet: 100 bytes" in output and "already imported" not in output
    code, output = _cli("dataset", "export", str(directory), "npy", str(tmp_path / "out"))
    _one_line(code, output, 4, f"{directory}: damaged dataset")
    assert not (tmp_path / "out").exists()
    (directory / "manifest.json").write_text("{")  # a manifest that is not JSON: damaged as well
    code, output = _cli(*args)
    _one_line(code, output, 4, "manifest.json: missing or not readable JSON")


def test_export_refuses_unreadable_queries_and_groundtruth(bigann, tmp_path: Path) -> None:
    imported, _ = bigann
    text = tmp_path / "queries.parquet"
    text.write_text("id,embedding\n0,1\n")
    no_query_id = tmp_path / "nq" / "groundtruth.parquet"
    no_query_id.parent.mkdir()
    pq.write_table(pa.table({"neighbors": [[1, 2]] * 100}), no_query_id)
    ragged = tmp_path / "ragged" / "groundtruth.parquet"
    ragged.parent.mkdir()
    lists = [[1, 2, 3]] * 99 + [[1, 2]]
    pq.write_table(pa.table({"query_id": np.arange(100), "neighbors": lists}), ragged)
    cases = [
        (["--queries", str(text)], f"{text}: not a readable Parquet file"),
        (["--groundtruth", str(no_query_id)], f"{no_query_id}: no column 'query_id'"),
        (
            ["--groundtruth", str(ragged.parent)],
            f"{ragged}: column 'neighbors': row 99 (0-based) has 2 values, row 0 has 3",
        ),
    ]
    for extra, message in cases:
        out = tmp_path / "out"
        code, output = _cli("dataset", "export", str(imported.directory), "fvecs", str(out), *extra)
        _one_line(code, output, 3, message)
        assert not out.exists() and not list(tmp_path.glob(".out.*"))


def test_concurrent_imports_of_the_same_files_make_one_dataset(shared_data: Path, tmp_path: Path) -> None:
    """Two processes at once: the second waits for the first's lock and finds its dataset."""
    import os
    import subprocess
    import sys

    repo = REPO
    env = {**os.environ, "PYTHONPATH": str(repo)}
    command = [sys.executable, "-m", "pipeline", "dataset", "import", "vecs"]
    command += [str(shared_data / "ann" / "fmnist1k"), "--name", "fm", "--workdir", str(tmp_path)]
    runs = [
        subprocess.Popen(command, env=env, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    try:
        outputs = [run.communicate(timeout=300)[0].decode() for run in runs]
    finally:
        for run in runs:  # none may outlive the test
            if run.poll() is None:
                run.kill()
                run.wait()
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert sorted(o.split(":")[0] for o in outputs) == ["already imported", "imported"], outputs
    (directory,) = _leftovers(tmp_path / "store")
    assert complete_manifest(directory, checksums=True) is not None


def test_export_metric_may_not_relabel_recorded_ground_truth(bigann) -> None:
    imported, _ = bigann
    assert locate(imported.directory, metric="l2").metric == "l2"  # agreeing: fine
    with pytest.raises(InputDataError, match="computed with metric l2; --metric cosine would relabel it"):
        locate(imported.directory, metric="cosine")


def test_export_refuses_a_folder_inside_the_dataset_or_its_store(bigann) -> None:
    from core.errors import ArtifactError

    imported, _ = bigann
    directory = imported.directory
    for out in (directory / "export", directory.parent / "export", directory.parent.parent / "x" / "y"):
        with pytest.raises(ArtifactError, match="inside the dataset"):
            export_dataset(locate(directory), "npy", out)
        assert not out.exists()
    assert not (directory.parent.parent / "x").exists()


def _touch(folder: Path, *names: str) -> Path:
    folder.mkdir()
    for name in names:
        (folder / name).touch()
    return folder


def test_folder_guessing_by_whole_words(tmp_path: Path) -> None:
    from apps.interchange.formats import find_files

    sift = _touch(
        tmp_path / "sift", "sift_base.fvecs", "sift_learn.fvecs", "sift_query.fvecs", "sift_groundtruth.ivecs"
    )
    found = find_files("vecs", [sift])
    assert {role: p.name for role, p in found.items()} == {
        "base": "sift_base.fvecs", "queries": "sift_query.fvecs", "groundtruth": "sift_groundtruth.ivecs"
    }  # fmt: skip
    latest = _touch(tmp_path / "latest", "latest.fvecs", "query.fvecs", "gt100.ivecs")
    found = find_files("vecs", [latest])
    assert (found["base"].name, found["queries"].name) == ("latest.fvecs", "query.fvecs")
    two = _touch(tmp_path / "two", "a.fvecs", "b.fvecs", "gt.ivecs")
    with pytest.raises(InputDataError) as error:
        find_files("vecs", [two])
    assert str(error.value) == (
        f"{two}: two candidate base files a.fvecs, b.fvecs; name them base/query or give the three paths"
    )


def test_the_sift1m_layout_imports_from_its_folder(shared_data: Path, tmp_path: Path) -> None:
    """SIFT1M's own names (with the learn set beside the base), on fmnist1k's real files."""
    root, folder = shared_data / "ann" / "fmnist1k", tmp_path / "sift"
    folder.mkdir()
    for theirs, ours in [("base", "base"), ("base", "learn"), ("query", "query")]:
        shutil.copy(root / f"fmnist1k_{theirs}.fvecs", folder / f"sift_{ours}.fvecs")
    shutil.copy(root / "fmnist1k_groundtruth.ivecs", folder / "sift_groundtruth.ivecs")
    imported = import_dataset("vecs", [folder], "sift", tmp_path / "store")
    assert imported.manifest["import"]["paths"]["base"].endswith("sift_base.fvecs")
    assert imported.check["disagree"] == 0 and imported.check["queries"] == 500


def test_an_unusable_workdir_or_out_dir_says_what_was_being_done(bigann, tmp_path: Path, shared_data) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    folder = str(shared_data / "ann" / "fmnist1k")
    code, output = _cli("dataset", "import", "vecs", folder, "--name", "fm", "--workdir", str(blocker))
    _one_line(
        code, output, 2, f"cannot create the store under {blocker}: {blocker} is a file, not a directory"
    )
    workdir, datasets = tmp_path / "wd", tmp_path / "wd" / "store" / "datasets"
    datasets.parent.mkdir(parents=True)
    datasets.write_text("")  # the store's folder itself a file: mkdir's EEXIST
    code, output = _cli("dataset", "import", "vecs", folder, "--name", "fm", "--workdir", str(workdir))
    _one_line(code, output, 2, f"cannot create the store under {workdir}: {datasets} is a file, not")
    imported, _ = bigann
    code, output = _cli("dataset", "export", str(imported.directory), "npy", str(blocker / "out"))
    _one_line(code, output, 2, f"{blocker / 'out'}: cannot create the output folder: {blocker} is a file")


def test_a_killed_imports_temporary_folder_is_swept(shared_data: Path, tmp_path: Path) -> None:
    import os
    import time

    from apps.interchange.importer import sweep_stale

    files = [
        shared_data / "ann" / "bigann10k" / n for n in ("base.10k.u8bin", "query.100.u8bin", "gt100.ibin")
    ]
    first = import_dataset("bin", files, "bg", tmp_path)
    shutil.rmtree(first.directory)
    stale = first.directory.parent / f".{first.directory.name}.k1lled_1.tmp"
    (stale / "part-00000.parquet").parent.mkdir()
    (stale / "part-00000.parquet").write_bytes(b"half")
    other = first.directory.parent / ".bg-0000000000000000.k1lled_2.tmp"  # another dataset's: not ours
    other.mkdir()
    again = import_dataset("bin", files, "bg", tmp_path)
    assert not again.cached and not stale.exists() and other.exists()
    # Without a lock (a file system refusing them) only an old one goes: a fresh one may be a live import's.
    fresh, old = (first.directory.parent / f".{first.directory.name}.{n}.tmp" for n in ("fresh", "old"))
    fresh.mkdir()
    old.mkdir()
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert sweep_stale(first.directory, locked=False) == [old] and fresh.exists()


def test_hdf5_is_closed_and_a_text_npy_is_named(shared_data: Path, tmp_path: Path) -> None:
    from apps.interchange.formats import open_source

    path = tmp_path / "small.hdf5"
    with h5py.File(path, "w") as h5:
        h5.create_dataset("train", data=np.eye(4, dtype=np.float32))
        h5.create_dataset("test", data=np.eye(4, dtype=np.float32)[:2])
        h5.create_dataset("neighbors", data=np.array([[0], [1]], np.int32))
    source = open_source("hdf5", [path])
    assert next(source.batches(10))[1].shape == (4, 4)
    with h5py.File(path, "w"):  # h5py refuses this while the file is open anywhere in the process
        pass
    text = tmp_path / "base.npy"
    text.write_text("1.0 2.0\n3.0 4.0\n")
    np.save(tmp_path / "query.npy", np.zeros((1, 2), np.float32))
    np.save(tmp_path / "gt.npy", np.zeros((1, 1), np.int32))
    with pytest.raises(InputDataError) as error:
        open_source("npy", [text, tmp_path / "query.npy", tmp_path / "gt.npy"])
    assert str(error.value).startswith(f"{text}: not a .npy array file") and "pickled" not in str(error.value)


def test_staged_directory_and_one_map_of_hdf5_names(tmp_path: Path) -> None:
    import os

    import apps.interchange.exporter as ann_export
    import apps.interchange.formats as ann_formats
    from core.store import staged_directory

    final = tmp_path / "final"
    with staged_directory(final) as tmp:
        (tmp / "a").write_text("a")
        assert not final.exists()
    umask = os.umask(0o022)
    os.umask(umask)
    assert (final / "a").read_text() == "a" and final.stat().st_mode & 0o777 == 0o755 & ~umask
    with pytest.raises(RuntimeError), staged_directory(tmp_path / "failed"):
        raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]
    assert ann_export.HDF5_DISTANCE is ann_formats.HDF5_DISTANCE and not hasattr(ann_export, "VDBBENCH_FILES")
    assert all(ann_formats.HDF5_METRICS[attr] == m for m, attr in ann_formats.HDF5_DISTANCE.items())


def test_the_documented_keys_are_current(shared_data: Path, tmp_path: Path) -> None:
    """docs/datasets.md's example output names the keys an import makes today."""
    import re

    docs = (REPO / "docs" / "datasets.md").read_text()
    documented = dict(re.findall(r"imported: \S+/store/datasets/([a-z0-9]+)-([0-9a-f]{16})", docs))
    bg = shared_data / "ann" / "bigann10k"
    made = import_dataset(
        "bin", [bg / "base.10k.u8bin", bg / "query.100.u8bin", bg / "gt100.ibin"], "bigann10k", tmp_path
    )
    assert documented["bigann10k"] == made.directory.name.rsplit("-", 1)[1]


# --- element types and empty shapes no format can import: one line naming the file (and HDF5 dataset) -----


def _small_set() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """20 base vectors x 4, 3 queries and their exact top-5 (l2), all valid."""
    base = np.random.default_rng(5).standard_normal((20, 4)).astype(np.float32)
    queries = base[:3] + 0.01
    order = np.argsort(((queries[:, None] - base[None]) ** 2).sum(-1), axis=1, kind="stable")
    return base, queries, order[:, :5].astype(np.int32)


def _npy_set(folder: Path, **arrays: np.ndarray) -> tuple[Path, Path, Path]:
    base, queries, gt = _small_set()
    folder.mkdir()
    files = (folder / "base.npy", folder / "query.npy", folder / "groundtruth.npy")
    for path, default in zip(files, (base, queries, gt), strict=True):
        np.save(path, arrays.get(path.stem, default))
    return files


def _hdf5_set(path: Path, group: str | None = None, **arrays: np.ndarray) -> Path:
    base, queries, gt = _small_set()
    with h5py.File(path, "w") as h5:
        for key, default in (("train", base), ("test", queries), ("neighbors", gt)):
            if key == group:
                h5.create_group(key).create_dataset("values", data=default)
            else:
                h5.create_dataset(key, data=arrays.get(key, default))
    return path


def _vdbbench_set(
    folder: Path, ids: list | None = None, neighbors: list | None = None, emb: list | None = None
) -> Path:
    base, queries, gt = _small_set()
    folder.mkdir()
    pq.write_table(
        pa.table({"id": ids or list(range(20)), "emb": emb or base.tolist()}), folder / "train.parquet"
    )
    pq.write_table(pa.table({"id": range(3), "emb": queries.tolist()}), folder / "test.parquet")
    table = pa.table({"id": range(3), "neighbors_id": neighbors or gt.tolist()})
    pq.write_table(table, folder / "neighbors.parquet")
    return folder


def _ibin_set(folder: Path, header: tuple[int, int]) -> list[Path]:
    base, queries, _ = _small_set()
    folder.mkdir()
    files = [folder / "base.fbin", folder / "query.fbin", folder / "gt.ibin"]
    vecs.write_bin(files[0], base.shape, [base])
    vecs.write_bin(files[1], queries.shape, [queries])
    files[2].write_bytes(np.array(header, "<u4").tobytes())
    return files


def _unimportable(tmp: Path, case: str) -> tuple[str, list[Path], str]:
    """(format, paths, the message's expected text) of one bad-input case, made in ``tmp``."""
    base, queries, gt = _small_set()
    text = np.full(queries.shape, "a")
    if case == "npy text queries":
        b, q, g = _npy_set(tmp / "d", query=text)
        return "npy", [tmp / "d"], f"{q}: query values must be real numbers, not <U1 (text)"
    if case == "npy text base":
        b, q, g = _npy_set(tmp / "d", base=np.full(base.shape, "a"))
        return "npy", [tmp / "d"], f"{b}: base values must be real numbers, not <U1 (text)"
    if case == "npy complex base":
        b, q, g = _npy_set(tmp / "d", base=base.astype(np.complex64) + 1j)
        return "npy", [tmp / "d"], f"{b}: base values must be real numbers, not complex64 (complex numbers)"
    if case == "npy base beyond float32":
        big = base.astype(np.float64)
        big[7, 1] = 1e39  # finite in the file, infinite as the float32 the dataset stores
        b, q, g = _npy_set(tmp / "d", base=big)
        return "npy", [tmp / "d"], f"{b}: base row 7 (0-based) holds NaN or an infinite value (or one beyond"
    if case == "npy float ids":
        b, q, g = _npy_set(tmp / "d", groundtruth=gt.astype(np.float32))
        return "npy", [tmp / "d"], f"{g}: neighbour ids must be integers, not float32"
    if case == "npy k=0":
        b, q, g = _npy_set(tmp / "d", groundtruth=gt[:, :0])
        return "npy", [tmp / "d"], f"{g}: no neighbours per query (k=0)"
    if case == "npy no queries":
        b, q, g = _npy_set(tmp / "d", query=queries[:0], groundtruth=gt[:0])
        return "npy", [tmp / "d"], f"{q}: no queries (0 rows)"
    h = tmp / "set.hdf5"
    if case == "hdf5 text train":
        _hdf5_set(h, train=np.full(base.shape, b"a"))
        return "hdf5", [h], f"{h}: dataset 'train': base values must be real numbers, not |S1 (bytes)"
    if case == "hdf5 train is a group":
        _hdf5_set(h, group="train")
        return "hdf5", [h], f"{h}: 'train' is an HDF5 group, not a dataset"
    if case == "hdf5 complex test":
        _hdf5_set(h, test=queries.astype(np.complex64))
        return "hdf5", [h], f"{h}: dataset 'test': query values must be real numbers, not complex64"
    if case in ("hdf5 fractional ids", "hdf5 float ids"):  # as .npy: a float type is refused, whole or not
        _hdf5_set(h, neighbors=gt + (0.5 if case == "hdf5 fractional ids" else 0.0))
        return "hdf5", [h], f"{h}: dataset 'neighbors': neighbour ids must be integers, not float64"
    if case == "hdf5 k=0":
        _hdf5_set(h, neighbors=gt[:, :0])
        return "hdf5", [h], f"{h}: dataset 'neighbors': no neighbours per query (k=0)"
    if case == "vdbbench text ids":
        folder = _vdbbench_set(tmp / "v", ids=[f"d{i}" for i in range(20)])
        return "vdbbench", [folder], f"{folder / 'train.parquet'}: column 'id' is string, expected integers"
    if case in ("vdbbench text neighbours", "vdbbench float neighbours"):
        ids = [[str(i) for i in row] for row in gt] if "text" in case else (gt + 0.5).tolist()
        folder = _vdbbench_set(tmp / "v", neighbors=ids)
        kind = "string" if "text" in case else "double"
        return "vdbbench", [folder], (
            f"{folder / 'neighbors.parquet'}: column 'neighbors_id' is list<element: {kind}>, "
            "expected a list of integers"
        )  # fmt: skip
    if case == "vdbbench short row":
        emb = base.tolist()
        emb[9] = emb[9][:-1]
        folder = _vdbbench_set(tmp / "v", emb=emb)
        return "vdbbench", [folder], f"{folder / 'train.parquet'}: column 'emb': row 9 (0-based) has"
    if case == "vdbbench short neighbour list":
        neighbors = gt.tolist()
        neighbors[2] = neighbors[2][:-1]
        folder = _vdbbench_set(tmp / "v", neighbors=neighbors)
        return "vdbbench", [folder], f"{folder / 'neighbors.parquet'}: column 'neighbors_id': row 2 (0-based)"
    if case == "vdbbench repeated id":
        folder = _vdbbench_set(tmp / "v", ids=[*range(19), 5])
        return (
            "vdbbench",
            [folder],
            f"{folder / 'train.parquet'}: the id column repeats ids (1 repeats; the first: id 5)",
        )
    rows, k = {"ibin k=0": (3, 0), "ibin no queries": (0, 5)}[case]
    files = _ibin_set(tmp / "b", (rows, k))
    empty = "no neighbours per query (k=0)" if k == 0 else "no queries (0 rows)"
    return "bin", files, f"{files[2]}: header says {rows}x{k}: {empty}"


UNIMPORTABLE = [
    "npy text queries", "npy text base", "npy complex base", "npy base beyond float32", "npy float ids",
    "npy k=0", "npy no queries",
    "hdf5 text train", "hdf5 train is a group", "hdf5 complex test", "hdf5 fractional ids", "hdf5 float ids",
    "hdf5 k=0", "vdbbench text ids", "vdbbench text neighbours", "vdbbench float neighbours", "ibin k=0",
    "ibin no queries", "vdbbench short row", "vdbbench short neighbour list", "vdbbench repeated id",
]  # fmt: skip


@pytest.mark.parametrize("case", UNIMPORTABLE)
def test_an_unimportable_element_type_or_empty_shape_is_one_line(tmp_path: Path, case: str) -> None:
    """Text, complex or record values, float neighbour ids, a group where a dataset belongs, no queries or
    k=0: refused at open naming the file (and the HDF5 dataset), exit 3, nothing written. Before, some
    gave a traceback, some a message without the file, and complex values lost their imaginary part."""
    fmt, paths, message = _unimportable(tmp_path, case)
    args = [str(p) for p in paths]
    code, output = _cli("dataset", "import", fmt, *args, "--name", "x", "--workdir", str(tmp_path / "w"))
    _one_line(code, output, 3, message)
    assert _leftovers(tmp_path / "w" / "store") == []


@pytest.mark.parametrize("case", ["npy text queries", "hdf5 train is a group", "vdbbench text ids"])
def test_an_unimportable_file_in_a_config_is_a_config_error(tmp_path: Path, write_config, case: str) -> None:
    """``dataset.imported`` opens the files at validate: the same refusal, on the field's line, exit 2."""
    fmt, paths, message = _unimportable(tmp_path, case)
    config = {
        "name": "imp",
        "workdir": str(tmp_path / "w"),
        "dataset": {"name": "imp", "imported": {"format": fmt, "paths": [str(p) for p in paths]}},
        "groundtruth": {"k": 5, "metric": "l2"},
        "executor": {"platform": "local", "workers": 1},
    }
    path = write_config(config)
    code, output = _cli("validate", str(path))
    _one_line(code, output, 2, f"dataset.imported.paths: {message}")
    assert "Traceback" not in output and not (tmp_path / "w" / "store" / "datasets").exists()


def test_zero_vectors_under_cosine_are_a_warning_naming_the_first(tmp_path: Path) -> None:
    """A vector of norm 0 has no cosine distance: each engine and the exact search give it their own value.
    The import goes on (the vectors are the source's) and says so, on the console and in the manifest."""
    base, queries, _ = _small_set()
    base[[4, 9]] = 0.0
    queries[2] = 0.0
    order = np.argsort(-(queries @ base.T), axis=1, kind="stable")[:, :5].astype(np.int32)
    b, q, _g = _npy_set(tmp_path / "d", base=base, query=queries, groundtruth=order)
    code, output = _cli("dataset", "import", "npy", str(tmp_path / "d"), "--name", "z", "--metric", "cosine",
                        "--workdir", str(tmp_path / "w"))  # fmt: skip
    assert code == 0, output
    said = " ".join(output.split())
    assert f"warning: 2 base vector(s) of norm 0 under metric cosine (first: {b} row 4, 0-based)" in said
    assert f"warning: 1 query vector(s) of norm 0 under metric cosine (first: {q} row 2, 0-based)" in said
    manifest = json.loads(next((tmp_path / "w" / "store" / "datasets").glob("z-*/manifest.json")).read_text())
    assert sum("of norm 0 under metric cosine" in w for w in manifest["warnings"]) == 2
