"""Pes2o-VE as Qwen3-Embedding's own recipe makes it: the tokenizer's own token ids, and vectors equal to
what sentence-transformers gives for the same model directory.

The model is a tiny randomly initialised Qwen3 laid out as ``Qwen/Qwen3-Embedding-*`` is on the hub
(``benchmarks/common/qwen3.py``): its tokenizer appends ``<|endoftext|>`` through the post-processor while
its ``eos_token`` is ``<|im_end|>``, so a recipe that appends ``eos_token_id`` fails here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apps.dataset.embedding.model import QWEN3_QUERY_TASK, Embedder, EmbeddingConfig, format_query
from apps.dataset.layout import arrow_to_vectors
from benchmarks.common import qwen3
from core.errors import ArtifactError, ConfigError
from tests.conftest import base_config, sample_records
from tests.dataset.test_embedding import cosines

# float32 on both sides: the same weights and token ids, different batch shapes (padding, order).
FLOAT32_COSINE = 1 - 1e-5
# bfloat16 on both sides: bf16 kernels round differently per batch shape (measured ~1e-4 here).
BFLOAT16_COSINE = 1 - 2e-3
END = 151643  # <|endoftext|>: what Qwen3-Embedding's tokenizer appends
IM_END = 151645  # <|im_end|>: what its tokenizer_config.json calls eos_token


@pytest.fixture(scope="module")
def model_dir(shared_data: Path, tmp_path_factory) -> Path:
    return qwen3.write_model(tmp_path_factory.mktemp("qwen3-embedding"), shared_data / "qwen-tokenizer")


@pytest.fixture(scope="module")
def reference(model_dir: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)


@pytest.fixture(scope="module")
def documents() -> list[str]:
    """Real abstracts of many lengths; several longer than the 64 tokens the tests allow."""
    return [r["text"][: 40 + 60 * i] for i, r in enumerate(sample_records(12))] + ["a", "Phage lambda"]


QUERIES = ["phage lambda repressor", "Sensor protein PhoQ", "magnesium transport", "CRISPR"]


def cfg(model_dir: Path, **overrides) -> EmbeddingConfig:
    settings = {
        "backend": "transformers",
        "model": str(model_dir),
        "pooling": "last_token",
        "max_length": 64,
        "token_budget": 512,
        "max_batch_size": 8,
        "query_task": QWEN3_QUERY_TASK,
    }
    return EmbeddingConfig(**{**settings, **overrides})


# --- token ids -------------------------------------------------------------------------------------------


def test_the_fixture_is_shaped_as_qwen3_embedding(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", IM_END)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", END)
    assert tokenizer(["test"])["input_ids"] == [[1944, END]]  # as QwenLM/Qwen3-Embedding issue #122 prints


@pytest.mark.parametrize("kind", ["documents", "queries", "longer than max_length"])
def test_token_ids_are_the_tokenizers_own(model_dir: Path, documents: list[str], kind: str) -> None:
    from transformers import AutoTokenizer

    texts = {
        "documents": [*documents[-2:], documents[0]],
        "queries": [format_query(q, QWEN3_QUERY_TASK) for q in QUERIES],
        "longer than max_length": documents[6:-2],
    }[kind]
    embedder = Embedder(cfg(model_dir))
    expected = AutoTokenizer.from_pretrained(model_dir)(texts, truncation=True, max_length=64)["input_ids"]
    encoded = embedder.encode_ids(texts)
    assert [e.ids for e in encoded] == expected
    assert all(e.ids[-1] == END for e in encoded)  # kept by truncation too; never <|im_end|>
    whole = AutoTokenizer.from_pretrained(model_dir)(texts)["input_ids"]
    assert [e.truncated for e in encoded] == [len(ids) > 64 for ids in whole]
    if kind == "longer than max_length":
        assert all(e.truncated and len(e.ids) == 64 for e in encoded)


def test_a_text_of_exactly_max_length_tokens_is_not_counted_as_truncated(
    model_dir: Path, documents: list[str]
) -> None:
    embedder = Embedder(cfg(model_dir))
    words = embedder.tokenizer(documents[6], add_special_tokens=False)["input_ids"][:63]
    text = embedder.tokenizer.decode(words)
    (fits,) = embedder.encode_ids([text])
    assert len(fits.ids) == 64 and fits.ids[-1] == END and not fits.truncated
    (cut,) = embedder.encode_ids([text + " phage"])
    assert len(cut.ids) == 64 and cut.ids[-1] == END and cut.truncated


def test_left_padding_keeps_every_texts_end_token_in_the_last_column(model_dir: Path) -> None:
    embedder = Embedder(cfg(model_dir))
    features = embedder._pad(embedder.encode_ids(["short text", "a somewhat longer text about phages"]))
    assert features["attention_mask"][0, 0] == 0 and features["attention_mask"][0, -1] == 1
    assert (features["input_ids"][:, -1] == END).all()


@pytest.fixture(scope="module")
def no_end_token_model(model_dir: Path, shared_data: Path, tmp_path_factory) -> Path:
    """The same weights with a Qwen2 tokenizer of the same vocabulary, which appends no end token."""
    directory = tmp_path_factory.mktemp("no-end-token")
    shutil.copytree(model_dir, directory, dirs_exist_ok=True)
    (directory / "tokenizer.json").unlink()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(shared_data / "qwen-tokenizer" / name, directory / name)
    return directory


@pytest.mark.parametrize("backend", ["transformers", "sentence-transformers"])
def test_last_token_pooling_over_a_tokenizer_without_end_token_is_refused(
    no_end_token_model: Path, backend: str
) -> None:
    with pytest.raises(ConfigError, match="appends no end token"):
        Embedder(cfg(no_end_token_model, backend=backend))


def test_mean_pooling_needs_no_end_token(no_end_token_model: Path) -> None:
    vectors, _ = Embedder(cfg(no_end_token_model, pooling="mean")).embed(["phage"], is_query=False)
    assert vectors.shape == (1, 64)


@pytest.fixture(scope="module")
def fast_tokenizer_only_model(no_end_token_model: Path, tmp_path_factory) -> Path:
    """The same, with its tokenizer as one tokenizer.json (no tokenizer_config.json, vocab or merges)."""
    from transformers import AutoTokenizer

    directory = tmp_path_factory.mktemp("tokenizer-json-only")
    shutil.copytree(no_end_token_model, directory, dirs_exist_ok=True)
    AutoTokenizer.from_pretrained(no_end_token_model).backend_tokenizer.save(
        str(directory / "tokenizer.json")
    )
    for name in ("tokenizer_config.json", "vocab.json", "merges.txt", "chat_template.jinja"):
        (directory / name).unlink(missing_ok=True)
    return directory


@pytest.mark.parametrize(
    ("backend", "which", "field"),
    [
        ("transformers", "no_end_token_model", "embedding.pooling"),
        ("transformers", "fast_tokenizer_only_model", "embedding.pooling"),
        ("sentence-transformers", "no_end_token_model", "embedding.model"),  # its own Pooling module
    ],
)
def test_validate_refuses_last_token_pooling_without_end_token(
    request, small_corpus: Path, tmp_path: Path, write_config, backend: str, which: str, field: str
) -> None:
    from pipeline.config.loader import load_config
    from pipeline.plan import build_plan

    model = request.getfixturevalue(which)
    embedding = {"backend": backend, "model": str(model), "pooling": "last_token"}
    path = write_config(base_config(small_corpus, tmp_path / "work", embedding=embedding))
    with pytest.raises(ConfigError, match="appends no end token") as info:
        build_plan(load_config(path))
    assert field in str(info.value)


# --- vectors equal to sentence-transformers ---------------------------------------------------------------


def run_embed_and_queries_stages(tmp: Path, embedding: EmbeddingConfig, documents: list[str]) -> tuple:
    """The embed stage over one chunk shard and the queries stage over a term list, as a run calls them."""
    from apps.dataset.embedding.stage import embed_shard
    from apps.dataset.queries import QueriesConfig, build_queries

    chunks = tmp / "chunks.parquet"
    pq.write_table(
        pa.table(
            {
                "chunk_id": [f"c{i}" for i in range(len(documents))],
                "doc_id": [f"d{i}" for i in range(len(documents))],
                "chunk_index": pa.array([0] * len(documents), pa.int32()),
                "text": documents,
            }
        ),
        chunks,
    )
    metadata = {"dataset_key": "test", "dimension": 64}
    record = embed_shard(str(chunks), 0, str(tmp / "dataset"), embedding, metadata, 0.0, 64)
    part = pq.read_table(tmp / "dataset" / record["file"])
    terms = tmp / "terms.txt"
    terms.write_text("\n".join(QUERIES) + "\n")
    queries = QueriesConfig(source="terms", terms_file=str(terms), instruction=True)
    build_queries(str(tmp / "queries"), queries, embedding, str(terms), [], 0.0)
    table = pq.read_table(tmp / "queries" / "queries.parquet")
    return arrow_to_vectors(part.column("embedding")), arrow_to_vectors(table.column("embedding"))


@pytest.mark.parametrize("backend", ["transformers", "sentence-transformers"])
def test_stages_give_the_vectors_of_sentence_transformers(
    model_dir: Path, reference, documents: list[str], tmp_path: Path, backend: str
) -> None:
    ours, our_queries = run_embed_and_queries_stages(tmp_path, cfg(model_dir, backend=backend), documents)
    reference.max_seq_length = 64
    expected = reference.encode(documents, batch_size=4)
    expected_queries = reference.encode(QUERIES, prompt_name="query", batch_size=4)
    assert cosines(ours, expected).min() >= FLOAT32_COSINE
    assert cosines(our_queries, expected_queries).min() >= FLOAT32_COSINE
    # The instruction matters: without it the queries are other vectors.
    assert cosines(our_queries, reference.encode(QUERIES)).max() < FLOAT32_COSINE


def test_bfloat16_agrees_with_sentence_transformers_in_bfloat16(
    model_dir: Path, documents: list[str]
) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(
        str(model_dir), device="cpu", local_files_only=True, model_kwargs={"torch_dtype": torch.bfloat16}
    )
    reference.max_seq_length = 64
    ours, _ = Embedder(cfg(model_dir, dtype="bfloat16")).embed(documents, is_query=False)
    expected = reference.encode(documents, batch_size=4, convert_to_tensor=True).float().numpy()
    assert cosines(ours, expected).min() >= BFLOAT16_COSINE


@pytest.mark.parametrize("backend", ["transformers", "sentence-transformers"])
def test_matryoshka_dimensions_agree_with_sentence_transformers(
    model_dir: Path, documents: list[str], backend: str
) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True, truncate_dim=32)
    reference.max_seq_length = 64
    ours, _ = Embedder(cfg(model_dir, backend=backend, dimension=32)).embed(documents, is_query=True)
    expected = reference.encode(documents, prompt_name="query", batch_size=4)
    assert ours.shape == (len(documents), 32)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # renormalised after the cut
    assert cosines(ours, expected).min() >= FLOAT32_COSINE


def test_queries_without_the_instruction_are_embedded_as_documents(model_dir: Path) -> None:
    embedder = Embedder(cfg(model_dir))
    plain, _ = embedder.embed(QUERIES, is_query=True, instruction=False)
    as_documents, _ = embedder.embed(QUERIES, is_query=False)
    np.testing.assert_array_equal(plain, as_documents)


def test_the_model_query_prompt_is_the_recipes(model_dir: Path) -> None:
    prompts = json.loads((model_dir / "config_sentence_transformers.json").read_text())["prompts"]
    assert prompts["query"] == format_query("", QWEN3_QUERY_TASK)


def test_the_recipe_version_is_part_of_the_datasets_content_key(
    model_dir: Path, small_corpus: Path, tmp_path: Path, write_config, monkeypatch
) -> None:
    """A dataset made by the old tokenization (recipe 1) is never reused as one of recipe 2."""
    import pipeline.plan as plan_module
    from pipeline.config.loader import load_config

    embedding = {"backend": "transformers", "model": str(model_dir), "pooling": "last_token"}
    path = write_config(base_config(small_corpus, tmp_path / "work", embedding=embedding, queries=None))
    now = plan_module.build_plan(load_config(path))
    monkeypatch.setattr(plan_module, "TRANSFORMERS_RECIPE", "1")
    before = plan_module.build_plan(load_config(path))
    assert now.stage("embed").key != before.stage("embed").key
    assert now.stage("chunk").key == before.stage("chunk").key  # the chunks do not depend on it


def test_ground_truth_refuses_queries_and_dataset_of_different_precisions(tmp_path: Path) -> None:
    """Queries cached from a run on another kind of CPU meet the dataset at the ground truth."""
    from pipeline.dag import groundtruth_after_dataset

    queries_file = tmp_path / "queries" / "queries.parquet"
    with pytest.raises(ArtifactError, match=r"queries in .*queries were computed in float32, the dataset in"):
        groundtruth_after_dataset(
            str(tmp_path / "gt"),
            str(tmp_path / "ds"),
            str(queries_file),
            None,
            {"precision": "bfloat16"},
            {"precision": "float32"},
        )
    assert not (tmp_path / "gt").exists()
