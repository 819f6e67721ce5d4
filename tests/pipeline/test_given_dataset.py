"""A run given its dataset (``dataset.imported`` / ``dataset.stored``) instead of generating it.

``configs/local-ann.yaml`` as a user runs it, on both bundled ANN sets: imported as the run's first stage,
its published ground truth used, Qdrant (edge), Milvus, Weaviate and FAISS loaded and queried; the report's
recall must equal a recomputation from the raw result files and the published ``.ivecs`` read here with
numpy alone. The fast tests use a stored dataset (made by ``dataset import``) and the config errors.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from core.errors import ConfigError
from pipeline.config.loader import load_config
from pipeline.plan import build_plan
from tests.conftest import REPO, run_cli
from tests.pipeline.test_local_engines import leftover_servers

CONFIG = REPO / "configs" / "local-ann.yaml"
ANN = REPO / "datasets" / "ann"
ENGINES = {"qdrant", "milvus", "weaviate", "faiss"}


def published_truth(name: str) -> np.ndarray:
    """``<name>_groundtruth.ivecs`` read with numpy alone: per row an int32 width, then that many ids."""
    raw = np.fromfile(ANN / name / f"{name}_groundtruth.ivecs", dtype=np.int32)
    return raw.reshape(-1, raw[0] + 1)[:, 1:]


def recomputed_recall(raw_file: Path, truth: np.ndarray) -> float:
    """Mean |returned top-k ∩ published top-k| / k over every request row of a raw result file."""
    rows = pq.read_table(raw_file, columns=["query_id", "ids", "k"]).to_pylist()
    return float(
        np.mean(
            [
                len(set(r["ids"][: r["k"]]) & set(truth[r["query_id"], : r["k"]].tolist())) / r["k"]
                for r in rows
            ]
        )
    )


def executors_of(run_dir: Path, app: str) -> list[str]:
    """The executor labels the tasks of ``app`` ran on, from the run's Parsl log."""
    log = "\n".join(p.read_text() for p in (run_dir / "parsl").rglob("parsl.log"))
    tasks = re.findall(rf"Task (\d+) submitted for App {app}\b", log)
    return [m for t in tasks for m in re.findall(rf"Parsl task {t} try \d+ launched on executor (\w+)", log)]


@pytest.fixture(scope="module", params=["fmnist1k", "bigann10k"])
def ann_run(request):
    """``configs/local-ann.yaml`` run as written, for one bundled set: (name, workdir, run dir, env, the
    ``--dataset`` arguments that pick the set)."""
    name = request.param
    root = Path(tempfile.mkdtemp(prefix=f"local-ann-{name}-", dir="/tmp"))
    env = {"PIPELINE_WORKDIR": str(root)}
    which = [] if name == "fmnist1k" else ["--dataset", name]  # the file's own, or its datasets entry
    try:
        result = run_cli("run", str(CONFIG), *which, env=env, timeout=900)
        assert result.returncode == 0, result.stderr[-4000:]
        run_dir = sorted((root / "runs").iterdir())[-1]
        yield name, root, run_dir, env, which
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_report_recall_equals_a_recomputation_from_the_published_truth(ann_run) -> None:
    name, _, run_dir, _, _ = ann_run
    outputs = json.loads((run_dir / "provenance.json").read_text())["outputs"]
    vdb = Path(outputs["vdb"])
    results = pq.read_table(vdb / "report" / "results.parquet").to_pylist()
    assert not [(r["label"], r["stage"], r["error"]) for r in results if r["status"] != "ok"]
    queries = [r for r in results if r["stage"] == "query"]
    assert {r["label"] for r in queries} == ENGINES
    truth = published_truth(name)
    for row in queries:
        raw = (
            vdb
            / row["label"]
            / "raw"
            / f"ef{row['ef']}_batch{row['batch_size']}_clients1_k{row['k']}.parquet"
        )
        assert row["recall"] == pytest.approx(recomputed_recall(raw, truth), abs=1e-12), (row["label"], raw)
    for engine in ENGINES:  # HNSW at ef 64 on these small sets finds nearly every neighbour
        assert max(r["recall"] for r in queries if r["label"] == engine) >= 0.95, engine


@pytest.mark.slow
def test_the_import_is_a_stage_and_its_published_truth_is_used(ann_run) -> None:
    name, root, run_dir, env, which = ann_run
    assert "Traceback" not in (run_dir / "pipeline.log").read_text()  # no callback failed on the way
    provenance = json.loads((run_dir / "provenance.json").read_text())
    dataset = Path(provenance["outputs"]["embed"])
    assert dataset.parent == root / "store" / "datasets" and dataset.name.startswith(f"{name}-")
    manifest = json.loads((dataset / "manifest.json").read_text())
    assert manifest["rows"] == {"fmnist1k": 1000, "bigann10k": 10000}[name]
    truth_dir = Path(provenance["outputs"]["groundtruth"])
    truth = json.loads((truth_dir / "manifest.json").read_text())
    assert truth["source"] == "published" and truth["k"] == 100
    neighbors = pq.read_table(truth_dir / "groundtruth.parquet").column("neighbors").to_pylist()
    assert np.array_equal(np.asarray(neighbors), published_truth(name))
    # The report rewrites from the run's record (its recorded config validates again).
    rewritten = run_cli("report", str(run_dir), env=env, timeout=300)
    assert rewritten.returncode == 0, rewritten.stderr[-2000:]
    # A second run finds every stage complete and starts nothing.
    again = run_cli("run", str(CONFIG), *which, env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "every stage is complete already" in again.stderr
    assert leftover_servers(root) == []


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    """A workdir whose store holds fmnist1k, imported with ``dataset import`` as a user would."""
    workdir = tmp_path_factory.mktemp("stored")
    result = run_cli(
        "dataset", "import", "vecs", str(ANN / "fmnist1k"), "--name", "fm", "--metric", "l2",
        "--workdir", str(workdir),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return workdir


def given_config(workdir: Path, dataset: dict, **sections) -> dict:
    config = {
        "name": "given",
        "workdir": str(workdir),
        "dataset": dataset,
        "groundtruth": {"k": 10, "metric": "l2", "memory_budget_mb": 16},
        "executor": {"platform": "local", "workers": 1},
        "geometry": {"enabled": False},
    }
    return {**config, **sections}


def test_a_stored_dataset_runs_with_its_published_truth_cut_to_k(stored, write_config) -> None:
    path = write_config(given_config(stored, {"name": "fm", "stored": "fm"}, geometry={"sample_rows": 500}))
    plan = run_cli("plan", str(path))
    assert plan.returncode == 0, plan.stderr
    assert "embed (stored)" in plan.stdout and "dataset fm: 1,000 vectors x 784, stored in" in plan.stdout
    assert "\n  ground truth: the dataset's published lists, cut to k=10\n" in plan.stdout
    result = run_cli("run", str(path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = sorted((stored / "runs").iterdir())[-1]
    truth_dir = Path(json.loads((run_dir / "provenance.json").read_text())["outputs"]["groundtruth"])
    assert json.loads((truth_dir / "manifest.json").read_text())["source"] == "published"
    neighbors = np.asarray(pq.read_table(truth_dir / "groundtruth.parquet").column("neighbors").to_pylist())
    assert np.array_equal(neighbors, published_truth("fmnist1k")[:, :10])
    # Cutting the published lists needs no GPU: the driver's threads do it (on an HPC platform the GPU
    # block then never starts; tests/executors/test_hpc_config.py).
    assert executors_of(run_dir, "run_groundtruth") == ["driver"]
    # The geometry measures the dataset's own queries and ground truth too (a given dataset has no
    # queries section): the queries' LID and the relative contrast, not a dash.
    geometry = Path(json.loads((run_dir / "provenance.json").read_text())["outputs"]["geometry"])
    record = json.loads((geometry / "geometry.json").read_text())
    assert (
        record["lid_queries"]["mean"] > 1
        and record["relative_contrast"] > 1
        and record["nn_source"] == "groundtruth"
    )


def test_a_k_beyond_the_published_lists_is_computed_exactly(stored, write_config) -> None:
    config = given_config(stored, {"name": "fm", "stored": "fm"}, groundtruth={"k": 150, "metric": "l2"})
    said = build_plan(load_config(write_config(config))).truth_source  # plan says so before the run
    held = "it holds 100 neighbours per query, the run asks 150"
    assert said == f"exact search: the dataset's published ground truth does not serve ({held})"
    result = run_cli("run", str(write_config(config)), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ground truth computed by exact search: it holds 100 neighbours per query, the run asks 150" in (
        result.stderr.replace("\n", " ")
    )
    run_dir = sorted((stored / "runs").iterdir())[-1]
    truth_dir = Path(json.loads((run_dir / "provenance.json").read_text())["outputs"]["groundtruth"])
    neighbors = np.asarray(pq.read_table(truth_dir / "groundtruth.parquet").column("neighbors").to_pylist())
    assert neighbors.shape == (500, 150)
    assert executors_of(run_dir, "run_groundtruth") == ["workers"]  # exact search: where the GPUs are
    # The first 100 exact neighbours are the published ones (fmnist1k has no ties among them).
    assert np.array_equal(neighbors[:, :100], published_truth("fmnist1k"))


def _refusal(write_config, config: dict) -> str:
    with pytest.raises(ConfigError) as error:
        build_plan(load_config(write_config(config)))
    return str(error.value)


def test_a_name_not_in_the_store_is_refused_naming_the_field(stored, write_config, monkeypatch) -> None:
    """The error names the config file as the user gave it, as the schema's errors do."""
    path = write_config(given_config(stored, {"name": "x", "stored": "gist-1m"}))
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "stored:" in text)
    monkeypatch.chdir(path.parent)
    for given in (path, Path(path.name)):
        with pytest.raises(ConfigError) as error:
            build_plan(load_config(given))
        assert str(error.value).startswith(f"{given}:{line}: dataset.stored: no dataset named 'gist-1m'")
        assert "datasets in it: fm" in str(error.value)


def test_a_damaged_dataset_named_in_the_store_is_refused_as_damaged(stored, tmp_path, write_config) -> None:
    """``stored: fm`` whose part was cut short: "damaged", not "no dataset named 'fm'" beside a list that
    names fm. The list offers only what a config can name: no temporary or damaged folder."""
    workdir = tmp_path / "w"
    shutil.copytree(stored / "store", workdir / "store")
    (folder,) = (workdir / "store" / "datasets").iterdir()
    (workdir / "store" / "datasets" / f".{folder.name}.x1y2.tmp").mkdir()  # an import killed mid-way
    shutil.copytree(folder, workdir / "store" / "datasets" / ".hidden-0123456789abcdef")
    part = folder / json.loads((folder / "manifest.json").read_text())["files"][0]["file"]
    part.chmod(0o644)
    part.write_bytes(part.read_bytes()[:-100])
    message = _refusal(write_config, given_config(workdir, {"name": "fm", "stored": "fm"}))
    assert f"dataset.stored: {folder} is damaged: {part}: " in message, message
    assert message.endswith("remove it and make it again"), message
    message = _refusal(write_config, given_config(workdir, {"name": "x", "stored": "other"}))
    assert message.endswith(
        "(it holds no dataset); make one with `python -m pipeline dataset import`, or name its folder's path"
    ), message


def test_a_damaged_stored_dataset_is_refused_naming_its_file(stored, tmp_path, write_config) -> None:
    """A part cut short, or queries changed in place (same size: only the checksum shows it), is refused at
    ``plan`` naming the file, not run against the wrong vectors. A path through ``..`` is named without it."""
    (tmp_path / "elsewhere").mkdir()
    for damage in ("part", "queries"):
        folder = tmp_path / damage
        shutil.copytree(next((stored / "store" / "datasets").iterdir()), folder)
        manifest = json.loads((folder / "manifest.json").read_text())
        target = folder / (manifest["files"][0] if damage == "part" else manifest["queries"])["file"]
        target.chmod(0o644)
        if damage == "part":
            target.write_bytes(target.read_bytes()[:-100])
        else:
            data = bytearray(target.read_bytes())
            data[-1] ^= 0xFF
            target.write_bytes(bytes(data))
        named = f"{tmp_path}/elsewhere/../{damage}"
        message = _refusal(write_config, given_config(stored, {"name": "fm", "stored": named}))
        assert f"dataset.stored: {folder} is damaged: {target}: " in message
        assert ("bytes, manifest says" if damage == "part" else "sha256 differs") in message


def test_a_damaged_earlier_import_is_refused_at_plan(stored, tmp_path, write_config) -> None:
    """``dataset.imported`` whose earlier import was damaged since (a ground truth cut short): refused at
    ``plan`` naming the file, as ``dataset import`` and ``dataset.stored`` refuse it; ``plan`` called it
    complete and ``run`` ended in a Parquet error after starting its workers."""
    workdir = tmp_path / "wd"
    shutil.copytree(stored, workdir)
    folder = next((workdir / "store" / "datasets").iterdir())
    truth = folder / "groundtruth.parquet"
    truth.chmod(0o644)
    truth.write_bytes(truth.read_bytes()[:100])
    imported = {"name": "fm", "imported": {"format": "vecs", "paths": [str(ANN / "fmnist1k")]}}
    message = _refusal(write_config, given_config(workdir, imported))
    assert (
        f"dataset.imported.paths: {folder} holds a damaged or incomplete dataset ({truth}: 100 bytes"
        in message
    )


def test_a_metric_other_than_the_datasets_is_refused(stored, write_config) -> None:
    config = given_config(stored, {"name": "fm", "stored": "fm"}, groundtruth={"k": 10, "metric": "cosine"})
    assert "groundtruth.metric: cosine differs from the dataset's metric l2" in _refusal(write_config, config)


def test_rows_and_k_beyond_the_dataset_are_refused_before_the_import(tmp_path, write_config) -> None:
    imported = {"name": "fm", "imported": {"format": "vecs", "paths": [str(ANN / "fmnist1k")]}}
    config = given_config(tmp_path / "wd", imported, groundtruth={"k": 2000, "metric": "l2"})
    refused = _refusal(write_config, config)
    # named by its base file: the dataset's folder is not made yet
    assert f"groundtruth.k: 2000 neighbours asked of a dataset of 1000 rows ({ANN / 'fmnist1k'}/" in refused
    vdb = {"databases": [{"name": "faiss"}], "insert": {"rows": 5000}, "query": {"k": [10]}}
    config = given_config(tmp_path / "wd", imported, vdb=vdb)
    assert "vdb.insert.rows: 5000 rows asked of a dataset of 1000 rows" in _refusal(write_config, config)
    assert not (tmp_path / "wd" / "store").exists()  # nothing written


def test_a_collection_the_dimension_cannot_take_is_refused_at_plan(tmp_path, write_config) -> None:
    """ivf_pq's pq_m must divide the dimension (784 = 16 x 49): refused naming the swept value's line,
    before the import, instead of when the index is built after the upload."""
    imported = {"name": "fm", "imported": {"format": "vecs", "paths": [str(ANN / "fmnist1k")]}}
    pq_sweep = {"name": "milvus", "label": "pq", "collection": {"index_type": "ivf_pq", "pq_m": [16, 24]}}
    vdb = {"databases": [{"name": "faiss"}, pq_sweep], "query": {"k": [10]}}
    message = _refusal(write_config, given_config(tmp_path / "wd", imported, vdb=vdb))
    assert "vdb.databases.1.collection.pq_m.1: 24 does not divide the dataset's dimension 784" in message
    assert not (tmp_path / "wd" / "store").exists()  # nothing written


def test_files_that_do_not_match_the_format_are_refused(tmp_path, write_config) -> None:
    imported = {"name": "fm", "imported": {"format": "hdf5", "paths": [str(ANN / "fmnist1k")]}}
    message = _refusal(write_config, given_config(tmp_path / "wd", imported))
    assert message.startswith(f"{tmp_path / 'config.yaml'}") and "dataset.imported.paths:" in message


@pytest.mark.parametrize(
    ("dataset", "extra", "expected"),
    [
        ({"name": "x", "stored": "fm"}, {"corpus": {"paths": ["a.jsonl"]}}, "remove corpus"),
        # a half-written embedding is to be removed, not completed with the model it lacks
        ({"name": "x", "stored": "fm"}, {"embedding": {"dimension": 256}}, "embedding: dataset.stored takes"),
        ({"name": "x"}, {}, "corpus and embedding missing"),
        (
            {"name": "x", "stored": "fm", "imported": {"format": "vecs", "paths": ["a"]}},
            {},
            "dataset.stored and dataset.imported both name the dataset",
        ),
        ({"name": "x", "imported": {"format": "parquet2", "paths": ["a"]}}, {}, "unknown format 'parquet2'"),
        ({"name": "x", "stored": "fm", "expected_rows": 5}, {}, "remove dataset.expected_rows"),
    ],
)
def test_contradictory_dataset_sections_exit_2(tmp_path, write_config, dataset, extra, expected) -> None:
    path = write_config(given_config(tmp_path, dataset, **extra))
    result = run_cli("validate", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stderr


def test_the_config_file_is_valid_yaml_with_no_generating_section() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert not {"corpus", "embedding", "chunking", "queries"} & set(config)
    assert {db["name"] for db in config["vdb"]["databases"]} == ENGINES


def test_plan_says_whether_an_imports_published_truth_will_serve(tmp_path, write_config) -> None:
    """Before the import, agreement with exact search is not known yet: plan says on what it depends, or
    that exact search is certain (the published lists hold fewer than k)."""
    imported = {"name": "fm", "imported": {"format": "vecs", "paths": [str(ANN / "fmnist1k")]}}

    def said(k: int) -> str:
        config = given_config(tmp_path / "wd", imported, groundtruth={"k": k, "metric": "l2"})
        return build_plan(load_config(write_config(config))).truth_source

    assert said(100) == (
        "the files' published lists, cut to k=100, if they agree with exact search when imported; else "
        "exact search"
    )
    held = "it holds 100 neighbours per query, the run asks 150"
    assert said(150) == f"exact search: the files' published ground truth does not serve ({held})"
    assert not (tmp_path / "wd" / "store").exists()  # nothing written


def test_the_dataset_line_names_a_source_type_other_than_float32(tmp_path, write_config) -> None:
    """bigann's base is uint8 in its files; the databases take it as float32: validate and plan say so."""
    from pipeline.cli.main import _input_line

    def line(name: str) -> str:
        imported = {"name": name, "imported": {"format": "vecs", "paths": [str(ANN / name)]}}
        config = given_config(tmp_path / "wd", imported, groundtruth={"k": 10, "metric": "l2"})
        return _input_line(build_plan(load_config(write_config(config)))).splitlines()[0]

    assert "dataset bigann10k: 10,000 vectors x 128 (uint8, stored as float32), imported" in line("bigann10k")
    assert "dataset fmnist1k: 1,000 vectors x 784, imported by the run into" in line("fmnist1k")
    # imported since (here by `dataset import` of the same files): the line no longer says the run will
    from apps.interchange.importer import import_dataset

    import_dataset("vecs", [ANN / "fmnist1k"], "fmnist1k", tmp_path / "wd" / "store")
    assert "dataset fmnist1k: 1,000 vectors x 784, imported into " in line("fmnist1k")


def test_an_import_under_a_study_name_without_its_dimension_is_refused_at_plan(tmp_path, write_config):
    """configs/polaris.yaml's gist-1m entry with GIST_DIR pointing at the wrong folder: exit 2 at validate,
    naming the field, before the import reads the files."""
    imported = {"name": "gist-1m", "imported": {"format": "vecs", "paths": [str(ANN / "fmnist1k")]}}
    path = write_config(given_config(tmp_path / "wd", imported))
    result = run_cli("validate", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "paths:" in text)
    assert f"config.yaml:{line}: dataset.imported.paths: " in result.stderr
    assert "784-dimensional vectors, but gist-1m's card (datasets/gist-1m.yaml) gives 960" in (
        result.stderr.replace("\n", " ")
    )
    assert not (tmp_path / "wd" / "store").exists()


def test_a_stored_dataset_under_a_study_name_without_its_dimension_is_refused(stored, write_config) -> None:
    """dataset: {name: gist-1m, stored: fm} would run fmnist1k's 784-d vectors as GIST: refused."""
    config = given_config(stored, {"name": "gist-1m", "stored": "fm"})
    refused = _refusal(write_config, config)
    assert "dataset.stored: " in refused and "784-dimensional vectors, but gist-1m's card" in refused
