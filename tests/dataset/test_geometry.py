"""Dataset geometry: intrinsic dimension (scikit-dimension's MLE and TwoNN) and relative contrast.

Synthetic point sets with a known intrinsic dimension check the estimators' plumbing (a wrong neighbour
list, a self-match or a wrong distance would move the figures far out of the bounds); the shared ANN
samples check real data; the stage, the plan keys, the report, the card and the command are exercised
on an imported real dataset.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from apps.dataset.geometry.estimates import GeometryConfig, GeometryRecord, estimate_geometry, sample_dataset
from apps.dataset.geometry.stage import (
    CARD_HEADING,
    compute_geometry,
    load_record,
    report_section,
    with_geometry,
)
from apps.interchange import vecs
from apps.interchange.importer import import_dataset
from core.errors import ConfigError
from pipeline.config.loader import load_config
from pipeline.plan import build_plan
from tests.conftest import base_config, run_cli


def subspace(rng: np.random.Generator, rows: int, dim: int, ambient: int = 64) -> np.ndarray:
    """Gaussian points on a random ``dim``-dimensional linear subspace of R^ambient (plus an offset)."""
    basis = np.linalg.qr(rng.normal(size=(ambient, dim)))[0]
    return rng.normal(size=(rows, dim)) @ basis.T + rng.normal(size=ambient)


@pytest.mark.parametrize(("dim", "low", "high"), [(2, 1.5, 3.0), (5, 4.0, 6.5)])
def test_linear_subspace_dimension_is_recovered(dim: int, low: float, high: float) -> None:
    rng = np.random.default_rng(dim)
    record = estimate_geometry(subspace(rng, 2000, dim), subspace(rng, 200, dim), "l2", k=20)
    assert low < record.lid_dataset.mean < high
    assert low < record.lid_dataset.harmonic < high
    assert low < record.twonn_dataset < high
    # the queries were drawn on another subspace of the same dimension: its LID is not ``dim`` relative
    # to the data, but it is finite and the contrast is defined
    assert record.lid_queries is not None and np.isfinite(record.lid_queries.mean)
    assert record.sample_rows == 2000 and record.query_rows == 200 and record.nn_source == "sample"


def test_queries_on_the_data_manifold_have_its_dimension() -> None:
    rng = np.random.default_rng(7)
    basis = np.linalg.qr(rng.normal(size=(64, 3)))[0]
    data, queries = rng.normal(size=(2000, 3)) @ basis.T, rng.normal(size=(300, 3)) @ basis.T
    record = estimate_geometry(data, queries, "l2", k=20)
    assert 2.2 < record.lid_queries.mean < 4.0 and 2.2 < record.twonn_queries < 4.0


def test_curved_two_dimensional_manifold() -> None:
    """A Swiss roll (2-D, curved) embedded in 64-D by a random rotation: ID about 2, not 3 or 64."""
    rng = np.random.default_rng(3)
    t, h = rng.uniform(1.5 * np.pi, 4.5 * np.pi, 3000), rng.uniform(0, 20, 3000)
    roll = np.stack([t * np.cos(t), h, t * np.sin(t)], axis=1)
    embedded = roll @ np.linalg.qr(rng.normal(size=(64, 3)))[0].T
    record = estimate_geometry(embedded, None, "l2", k=20)
    assert 1.5 < record.lid_dataset.mean < 3.0 and 1.5 < record.twonn_dataset < 3.0
    assert record.lid_queries is None and record.relative_contrast is None


def test_cosine_normalises_onto_the_sphere() -> None:
    """Points of a 5-D subspace through the origin at random radii: 5-D under L2, but their directions
    (what cosine compares) fill the 4-sphere."""
    rng = np.random.default_rng(5)
    basis = np.linalg.qr(rng.normal(size=(64, 5)))[0]
    points = rng.normal(size=(3000, 5)) @ basis.T * rng.uniform(0.5, 5.0, size=(3000, 1))
    cosine, l2 = estimate_geometry(points, None, "cosine"), estimate_geometry(points, None, "l2")
    assert 3.0 < cosine.lid_dataset.mean < 4.8 and 3.0 < cosine.twonn_dataset < 4.8
    assert 4.2 < l2.lid_dataset.mean < 6.5 and l2.lid_dataset.mean > cosine.lid_dataset.mean + 0.4
    assert cosine.distance.startswith("euclidean (unit-normalised")


def read_fmnist(shared_data: Path) -> tuple[np.ndarray, np.ndarray]:
    root = shared_data / "ann" / "fmnist1k"
    return vecs.read_vecs(root / "fmnist1k_base.fvecs"), vecs.read_vecs(root / "fmnist1k_query.fvecs")


def test_fmnist_is_lower_dimensional_and_higher_contrast_than_noise(shared_data: Path) -> None:
    base, queries = read_fmnist(shared_data)
    real = estimate_geometry(base, queries, "l2")
    rng = np.random.default_rng(0)
    noise = estimate_geometry(rng.normal(size=base.shape), rng.normal(size=queries.shape), "l2")
    for record in (real, noise):
        figures = [record.lid_dataset.mean, record.lid_queries.mean, record.twonn_dataset]
        assert all(np.isfinite(f) and f > 0 for f in figures) and record.relative_contrast > 1.0
    # images of clothes live near a low-dimensional manifold; 784-D Gaussian noise fills its space
    assert 3 < real.lid_dataset.mean < 40 and noise.lid_dataset.mean > 3 * real.lid_dataset.mean
    assert noise.twonn_dataset > 3 * real.twonn_dataset
    assert real.relative_contrast > 1.5 and noise.relative_contrast < 1.2
    assert real.relative_contrast > noise.relative_contrast + 0.5


def test_queries_that_are_dataset_rows_skip_their_copies(shared_data: Path) -> None:
    """bigann10k's 100 queries are its first 100 base rows: distance 0 is skipped, not a LID of 0."""
    root = shared_data / "ann" / "bigann10k"
    base, queries = (
        vecs.read_vecs(root / "bigann10k_base.bvecs"),
        vecs.read_vecs(root / "bigann10k_query.bvecs"),
    )
    record = estimate_geometry(base[:3000], queries, "l2")
    assert record.lid_queries.with_copies == 100 and record.lid_queries.points == 100
    assert 5 < record.lid_queries.mean < 40 and np.isfinite(record.relative_contrast)
    assert record.lid_dataset.with_copies == 0  # the base rows are distinct


@pytest.fixture(scope="module")
def fmnist_dataset(tmp_path_factory, shared_data: Path) -> Path:
    """fmnist1k imported (real data), with row groups of 100 rows so sampling has groups to choose."""
    store = tmp_path_factory.mktemp("geo") / "store"
    folder = shared_data / "ann" / "fmnist1k"
    return import_dataset("vecs", [folder], "fmnist1k", store, row_group_rows=100).directory


def test_sample_reads_at_most_max_row_groups_and_is_seeded(fmnist_dataset: Path) -> None:
    vectors, info = sample_dataset(fmnist_dataset, 150, seed=1, max_row_groups=3)
    assert info == {"dataset_rows": 1000, "row_groups_read": 3, "row_groups_total": 10}
    assert vectors.shape == (150, 784)
    again, _ = sample_dataset(fmnist_dataset, 150, seed=1, max_row_groups=3)
    other, _ = sample_dataset(fmnist_dataset, 150, seed=2, max_row_groups=3)
    assert np.array_equal(vectors, again) and not np.array_equal(vectors, other)
    everything, info = sample_dataset(fmnist_dataset, 5000, seed=1, max_row_groups=64)
    assert everything.shape == (1000, 784) and info["row_groups_read"] == 10
    assert len(np.unique(everything, axis=0)) == 1000  # without replacement


def test_stage_writes_record_card_and_is_not_rerun(fmnist_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "geometry"
    config = GeometryConfig(sample_rows=1000, k=20)
    files = [str(fmnist_dataset / "queries.parquet"), str(fmnist_dataset / "groundtruth.parquet")]
    manifest = compute_geometry(str(out), str(fmnist_dataset), *files, "l2", config)
    assert manifest["stage"] == "geometry" and manifest["card_updated"] and "cached" not in manifest
    record = GeometryRecord.model_validate(json.loads((out / "geometry.json").read_text()))
    assert record == load_record(out)
    assert record.nn_source == "groundtruth" and record.queries_total == 500 == record.query_rows
    assert record.lid_queries_full is not None and record.relative_contrast > 1.5
    card = (fmnist_dataset / "README.md").read_text()
    assert card.startswith("# fmnist1k") and card.count(CARD_HEADING) == 1
    assert f"{record.lid_dataset.mean:,.2f}" in card and "TwoNN" in card
    stamp = os.stat(out / "geometry.json").st_mtime_ns
    again = compute_geometry(str(out), str(fmnist_dataset), *files, "l2", config)
    assert again["cached"] and os.stat(out / "geometry.json").st_mtime_ns == stamp
    # a rewritten card keeps one geometry section, the rest of the card intact
    assert with_geometry(card, record) == card


def test_report_section_names_the_figures(fmnist_dataset: Path, tmp_path: Path) -> None:
    from apps.report.document import write_report

    assert report_section(None) == []
    out = tmp_path / "g"
    compute_geometry(
        str(out),
        str(fmnist_dataset),
        str(fmnist_dataset / "queries.parquet"),
        None,
        "l2",
        GeometryConfig(sample_rows=400),
    )
    record = load_record(out)
    assert record is not None and record.nn_source == "sample" and record.query_rows == 400
    report = write_report([], tmp_path / "report", geometry=record)["report"].read_text()
    assert "## Dataset geometry" in report and "He et al. 2012" in report
    assert f"{record.relative_contrast:,.2f}" in report and f"{record.twonn_queries:,.2f}" in report


def test_bad_geometry_values_name_the_field(write_config, small_corpus: Path, tmp_path: Path) -> None:
    for bad, field in (({"k": 1}, "geometry.k"), ({"sample_rows": 10}, "geometry.sample_rows")):
        with pytest.raises(ConfigError) as info:
            load_config(write_config(base_config(small_corpus, tmp_path, geometry=bad)))
        assert field in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(
            write_config(base_config(small_corpus, tmp_path, geometry={"k": 100, "sample_rows": 100}))
        )
    assert "geometry.k 100 must be below geometry.sample_rows 100" in str(info.value)


def test_plan_keys_the_stage_by_its_inputs(write_config, small_corpus: Path, tmp_path: Path) -> None:
    def plan(**geometry):
        return build_plan(load_config(write_config(base_config(small_corpus, tmp_path, geometry=geometry))))

    default, smaller = plan(), plan(sample_rows=1000)
    geo = default.stage("geometry")
    assert geo.upstream == [
        default.stage("embed").key,
        default.stage("queries").key,
        default.stage("groundtruth").key,
    ]
    assert smaller.stage("geometry").key != geo.key
    assert smaller.stage("groundtruth").key == default.stage("groundtruth").key  # nothing else reruns
    assert "geometry" not in plan(enabled=False).stages
    assert plan(enabled=True, k=20, seed=0).stage("geometry").key == geo.key  # defaults spelled out


@pytest.mark.slow  # two interpreter start-ups (~10 s here)
def test_geometry_command_prints_the_figures(fmnist_dataset: Path) -> None:
    result = run_cli("dataset", "geometry", str(fmnist_dataset), "--sample-rows", "600")
    assert result.returncode == 0, result.stderr
    assert "LID (MLE, k=20)" in result.stdout and "relative contrast (He et al. 2012)" in result.stdout
    assert "nearest distances from groundtruth" in result.stdout
    # the combined (harmonic-mean) estimate, the figure `dataset synth` compares, is printed and named
    assert re.search(r"LID \(MLE, k=20\) mean [\d.]+, median [\d.]+, combined [\d.]+;", result.stdout)
    bad = run_cli("dataset", "geometry", str(fmnist_dataset), "--k", "1")
    assert bad.returncode == 2 and "--k" in bad.stderr


@pytest.mark.slow  # a real run: Parsl workers, the real model on real abstracts
def test_run_writes_geometry_and_reruns_only_it_when_its_config_changes(
    small_corpus: Path, tmp_path: Path
) -> None:
    import yaml

    def run(**geometry) -> dict:
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump(base_config(small_corpus, tmp_path / "wd", geometry=geometry)))
        result = run_cli("run", str(config))
        assert result.returncode == 0, result.stderr[-3000:]
        runs = sorted((tmp_path / "wd" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
        return json.loads((runs[-1] / "provenance.json").read_text())

    first = run(sample_rows=200)
    geometry = Path(first["outputs"]["geometry"])
    record = load_record(geometry)
    assert record is not None and record.metric == "cosine" and record.query_rows == 20
    assert record.nn_source == "groundtruth" and record.lid_queries_full is None  # ground truth k=10 < 20
    assert record.sample_rows == min(200, record.dataset_rows) and np.isfinite(record.lid_dataset.mean)
    card = (Path(first["outputs"]["embed"]) / "README.md").read_text()
    assert card.startswith("# pes2o-ve") and CARD_HEADING in card and f"{record.twonn_dataset:,.2f}" in card
    second = run(sample_rows=300)  # only the geometry stage's input changed
    cached = {name: stage["cached"] for name, stage in second["stages"].items()}
    assert cached.pop("geometry") is False and all(cached.values()), cached
    assert Path(second["outputs"]["geometry"]) != geometry
    third = run(sample_rows=300)
    assert all(stage["cached"] for stage in third["stages"].values())
