"""``python -m pipeline dataset synth``: a SYNTHETIC dataset drawn from a model of a real one.

Fitted here to the bundled fmnist1k (imported as a user would), drawn small so the test is quick: the
folder is marked synthetic everywhere a reader looks, the same arguments draw the same bytes, its ground
truth is the exact top-k (recomputed here with numpy), and a run takes it as ``dataset.stored``.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from apps.dataset.layout import METADATA_KEY, arrow_to_vectors, iter_vectors
from tests.conftest import REPO, run_cli


@pytest.fixture(scope="module")
def drawn(tmp_path_factory) -> tuple[Path, Path, str]:
    """(workdir, synthetic folder, stdout) of fmnist1k imported, then 3,000 rows drawn like it."""
    workdir = tmp_path_factory.mktemp("synth")
    imported = run_cli(
        "dataset", "import", "vecs", str(REPO / "datasets" / "ann" / "fmnist1k"), "--name", "fm",
        "--metric", "l2", "--workdir", str(workdir),
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr[-2000:]
    args = ("dataset", "synth", "--like", "fm", "--rows", "3000", "--queries", "40", "--k", "10")
    result = run_cli(*args, "--components", "8", "--workdir", str(workdir))
    assert result.returncode == 0, result.stderr[-3000:]
    folders = sorted((workdir / "store" / "datasets").glob("fm-synth-3000-*"))
    assert len(folders) == 1, folders
    return workdir, folders[0], result.stdout


def test_it_is_marked_synthetic_wherever_it_is_read(drawn) -> None:
    _, folder, stdout = drawn
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["rows"] == 3000 and manifest["dimension"] == 784 and manifest["metric"] == "l2"
    assert manifest["synthetic"]["synthetic"] is True and manifest["synthetic"]["like"]["name"] == "fm"
    assert (folder / "README.md").read_text().startswith("# fm-synth-3000 (SYNTHETIC)")
    part_meta = json.loads(pq.read_schema(folder / "part-00000.parquet").metadata[METADATA_KEY.encode()])
    assert part_meta["source"] == "synthetic"
    lid = manifest["synthetic"]["lid"]
    assert lid["real"] > 0 and lid["synthetic"] > 0
    assert "SYNTHETIC dataset" in stdout and f"synthetic {lid['synthetic']}, real {lid['real']}" in stdout


def test_its_ground_truth_is_the_exact_top_k(drawn) -> None:
    _, folder, _ = drawn
    base = np.concatenate([vectors for _, vectors in iter_vectors(folder)]).astype(np.float64)
    queries = arrow_to_vectors(pq.read_table(folder / "queries.parquet").column("embedding")).astype(
        np.float64
    )
    truth = np.asarray(pq.read_table(folder / "groundtruth.parquet").column("neighbors").to_pylist())
    distances = ((queries[:, None, :] - base[None, :, :]) ** 2).sum(axis=2)
    expected = np.argsort(distances, axis=1, kind="stable")[:, :10]
    assert np.array_equal(truth, expected)


def test_the_same_arguments_draw_the_same_dataset(drawn) -> None:
    workdir, folder, _ = drawn
    again = run_cli(
        "dataset", "synth", "--like", "fm", "--rows", "3000", "--queries", "40", "--k", "10",
        "--components", "8", "--workdir", str(workdir),
    )  # fmt: skip
    assert again.returncode == 0 and "already drawn" in again.stdout, again.stderr
    other = run_cli(
        "dataset", "synth", "--like", "fm", "--rows", "3000", "--queries", "40", "--k", "10",
        "--components", "8", "--seed", "1", "--name", "fm-seed1", "--workdir", str(workdir),
    )  # fmt: skip
    assert other.returncode == 0, other.stderr[-2000:]
    (seeded,) = (workdir / "store" / "datasets").glob("fm-seed1-*")
    first = pq.read_table(folder / "part-00000.parquet").column("embedding").to_pylist()[:5]
    assert pq.read_table(seeded / "part-00000.parquet").column("embedding").to_pylist()[:5] != first


def test_a_run_takes_it_as_a_stored_dataset(drawn, write_config) -> None:
    workdir, folder, _ = drawn
    config = {
        "name": "synth-run",
        "workdir": str(workdir),
        "dataset": {"name": "fm-synth", "stored": str(folder)},
        "groundtruth": {"k": 10, "metric": "l2"},
        "geometry": {"enabled": False},
        "executor": {"platform": "local", "workers": 1},
        "vdb": {
            "databases": [{"name": "faiss"}],
            "query": {"ef": [16], "batch_size": [8], "k": [10], "max_queries": 10, "duration_s": 0.2},
        },
    }
    path = write_config(config)
    # Synthetic data says so wherever it appears: the config check, the report.
    valid = run_cli("validate", str(path))
    assert valid.returncode == 0 and "SYNTHETIC (drawn from a model of fm; not real data)" in valid.stdout
    assert "\n  ground truth: the dataset's exact lists, cut to k=10\n" in valid.stdout  # computed when drawn
    result = run_cli("run", str(path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = sorted((workdir / "runs").iterdir())[-1]
    outputs = json.loads((run_dir / "provenance.json").read_text())["outputs"]
    truth_dir = Path(outputs["groundtruth"])
    assert json.loads((truth_dir / "manifest.json").read_text())["source"] == "published"
    report = (Path(outputs["vdb"]) / "report" / "report.md").read_text().splitlines()
    assert report[2].startswith(
        f"Dataset: `fm-synth`, 3,000 vectors × 784, metric l2, stored (`{folder.name}`"
    )
    assert report[2].endswith("**SYNTHETIC (drawn from a model of fm; not real data)**")
    # `report <run>` rewrites it from the run's record, without the plan: the same line
    rewritten = run_cli("report", str(run_dir), env={"PIPELINE_WORKDIR": str(workdir)}, timeout=300)
    assert rewritten.returncode == 0, rewritten.stderr[-3000:]
    assert (Path(outputs["vdb"]) / "report" / "report.md").read_text().splitlines()[2] == report[2]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--like", "nope", "--rows", "100"), "--like 'nope': no dataset of that name in"),
        (("--like", "fm", "--rows", "5", "--k", "10"), "--k 10 exceeds --rows 5"),
        (("--like", "fm", "--rows", "100", "--components", "900"), "--components 900"),
        (("--like", "fm", "--rows", "100", "--pca-dims", "785"), "--pca-dims 785 exceeds the real dataset's"),
        (("--like", str(REPO / "configs"), "--rows", "100"), "configs is not a dataset (no dataset manifest"),
        (("--like", "fm", "--rows", "20", "--k", "10"), "--rows 20: draw at least 21"),
        # refused before a row is drawn, not when the disk fills
        (("--like", "fm", "--rows", str(10**14)), "784 float32 vectors take about 285217.5 TiB;"),
    ],
)
def test_bad_arguments_are_one_line_and_write_nothing(drawn, args, expected) -> None:
    workdir, _, _ = drawn
    before = sorted(p.name for p in (workdir / "store" / "datasets").iterdir())
    result = run_cli("dataset", "synth", *args, "--workdir", str(workdir))
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in " ".join(result.stderr.split()) and "Traceback" not in result.stderr
    assert sorted(p.name for p in (workdir / "store" / "datasets").iterdir()) == before


def test_a_synthetic_set_unlike_the_real_one_is_warned_of(drawn) -> None:
    """64 full-covariance components fitted to fmnist1k's 1,000 rows overfit: the drawn set's LID is far
    below the real one's (about -40%), so searching it is easier; the user is told, and why. The fixture's
    8 components are within the bound and draw no warning."""
    workdir, _, _ = drawn
    args = ("--rows", "1000", "--queries", "20", "--k", "10", "--components", "64", "--name", "fm-overfit")
    result = run_cli("dataset", "synth", "--like", "fm", *args, "--workdir", str(workdir))
    assert result.returncode == 0, result.stderr[-2000:]
    said = " ".join(result.stderr.split())
    assert (
        "warning: the synthetic set's intrinsic dimension is -" in said
        and "64 components were fitted" in said
    )
    (folder,) = (workdir / "store" / "datasets").glob("fm-overfit-*")
    shutil.rmtree(folder)  # the other tests count the store's datasets
    again = run_cli("dataset", "synth", "--like", "fm", "--rows", "3000", "--queries", "40", "--k", "10",
                    "--components", "8", "--workdir", str(workdir))  # fmt: skip
    assert again.returncode == 0 and "warning" not in again.stderr, again.stderr[-2000:]
    # Without --components: one per 128 real rows, 7 for these 1,000 (-15%), within the bound too
    args = ("--rows", "2000", "--queries", "20", "--k", "10", "--name", "fm-default")
    default = run_cli("dataset", "synth", "--like", "fm", *args, "--workdir", str(workdir))
    assert default.returncode == 0 and "warning" not in default.stderr, default.stderr[-2000:]
    assert "fitting 7 components" in default.stderr, default.stderr
    (folder,) = (workdir / "store" / "datasets").glob("fm-default-*")
    shutil.rmtree(folder)


def test_a_name_not_in_the_store_lists_what_is_there(drawn) -> None:
    """As a run config's dataset.stored does: the user sees which names would do."""
    workdir, _, _ = drawn
    result = run_cli("dataset", "synth", "--like", "nope", "--rows", "100", "--workdir", str(workdir))
    assert result.returncode == 2 and "(datasets in it: fm, " in " ".join(result.stderr.split())


def test_sigterm_mid_draw_ends_it_with_143_and_one_line_and_writes_nothing(drawn) -> None:
    """SIGTERM (a job's walltime, ``kill PID``) during a draw: ``terminated (SIGTERM)``, exit 143 as a shell
    reports it, no traceback, no dataset folder. Before, every command but ``run`` ended silently with 130."""
    workdir, _, _ = drawn
    before = sorted(p.name for p in (workdir / "store" / "datasets").iterdir())
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "dataset", "synth", "--like", "fm", "--rows", "2000000",
         "--name", "killed", "--workdir", str(workdir)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        seen = []
        for line in proc.stderr:  # the fit is announced once the command (and its SIGTERM handler) runs
            seen.append(line)
            if line.startswith("fitting"):
                break
        assert seen and seen[-1].startswith("fitting"), "".join(seen)
        proc.send_signal(signal.SIGTERM)
        err = "".join(seen) + proc.stderr.read()
        proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 143, err[-3000:]
    assert "terminated (SIGTERM)" in err and "Traceback" not in err, err[-3000:]
    assert sorted(p.name for p in (workdir / "store" / "datasets").iterdir()) == before


def test_a_set_of_integers_is_drawn_as_integers_in_its_types_range(tmp_path: Path) -> None:
    """bigann10k holds uint8 (.bvecs): its synthetic rows are whole numbers in 0-255 too, and say so."""
    imported = run_cli(
        "dataset", "import", "vecs", str(REPO / "datasets" / "ann" / "bigann10k"), "--name", "sift",
        "--workdir", str(tmp_path),
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr[-2000:]
    result = run_cli(
        "dataset", "synth", "--like", "sift", "--rows", "2000", "--queries", "20", "--k", "10",
        "--components", "8", "--workdir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = (tmp_path / "store" / "datasets").glob("sift-synth-2000-*")
    values = np.concatenate([vectors for _, vectors in iter_vectors(folder)])
    assert values.min() >= 0 and values.max() <= 255 and np.array_equal(values, np.rint(values))
    assert values.std() > 1  # not all clipped to one value
    assert "values rounded to integers in [0, 255]" in (folder / "README.md").read_text()


def test_a_damaged_dataset_to_imitate_is_named_as_damaged(drawn, tmp_path: Path) -> None:
    """--like fm whose part was cut short: exit 4, "damaged", not "no dataset of that name"."""
    import json

    workdir, _, _ = drawn
    (real,) = [
        p
        for p in (workdir / "store" / "datasets").iterdir()
        if json.loads((p / "manifest.json").read_text())["metadata"]["dataset_name"] == "fm"
    ]
    copy = tmp_path / "store" / "datasets" / real.name
    shutil.copytree(real, copy)
    part = copy / json.loads((copy / "manifest.json").read_text())["files"][0]["file"]
    part.chmod(0o644)
    part.write_bytes(part.read_bytes()[:-100])
    result = run_cli("dataset", "synth", "--like", "fm", "--rows", "100", "--workdir", str(tmp_path))
    assert result.returncode == 4, result.stderr
    assert f"--like 'fm': {copy} is damaged" in " ".join(result.stderr.split())


def test_a_draw_made_before_is_found_whatever_the_disk_holds(drawn) -> None:
    """The disk check (before_drawing) is for rows still to draw: the same arguments again find the draw,
    even on a disk that could no longer hold it."""
    from apps.interchange.synth import SynthSpec, synthesize
    from pipeline.given_dataset import stored_candidates

    workdir, folder, _ = drawn

    def disk_full() -> None:
        raise AssertionError("checked the disk for a draw that is made already")

    (like,) = stored_candidates(workdir / "store", "fm")
    spec = SynthSpec(rows=3000, queries=40, k=10, components=8, pca_dims=24, seed=0)
    found, _, cached = synthesize(like, "fm-synth-3000", workdir / "store", spec, before_drawing=disk_full)
    assert cached and found == folder
