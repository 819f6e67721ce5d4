"""Hostile and mistaken configurations: each is one clear line at ``validate`` (file, field), exit 2.

Every case here passed ``validate`` (or crashed it with a traceback, or hung it) before the checks were
added; ``run`` then died mid-way, sometimes after marking an artifact complete.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import base_config, run_cli


def _vdb(**sections: dict[str, Any]) -> dict[str, Any]:
    vdb: dict[str, Any] = {"databases": [{"name": "weaviate"}]}
    vdb.update(sections)
    return vdb


def _write(tmp_path: Path, config: dict[str, Any] | str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    text = config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


def _validate(path: Path, *fragments: str, timeout: float = 120) -> str:
    """Run ``validate``; assert exit 2, every fragment in the message and no traceback; return stderr."""
    result = run_cli("validate", str(path), timeout=timeout)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    flat = " ".join(output.split())  # rich wraps long lines
    for fragment in fragments:
        assert fragment in flat, f"{fragment!r} not in: {output[-3000:]}"
    return flat


LIST_ITEMS = [
    ("query", "k", [10, 0]),
    ("query", "ef", [16, -1]),
    ("query", "batch_size", [0]),
    ("query", "clients", [-2]),
    ("insert", "batch_sizes", [0, 256]),
]


@pytest.mark.parametrize(("section", "field", "value"), LIST_ITEMS)
def test_list_items_must_be_positive(small_corpus, tmp_path, section, field, value) -> None:
    config = base_config(small_corpus, tmp_path / "wd", vdb=_vdb(**{section: {field: value}}))
    bad = next(i for i, v in enumerate(value) if v < 1)
    _validate(
        _write(tmp_path, config), "config.yaml", f"vdb.{section}.{field}.{bad}", "greater than or equal to 1"
    )


@pytest.mark.parametrize(
    ("embedding", "field", "words"),
    [
        ({"max_length": 100000}, "embedding.max_length", "512"),  # MiniLM has 512 positions
        ({"dimension": 1024}, "embedding.dimension", "384"),  # MRL cannot widen a 384-d model
    ],
)
def test_embedding_beyond_the_model(small_corpus, tmp_path, embedding, field, words) -> None:
    config = base_config(small_corpus, tmp_path / "wd", embedding=embedding)
    _validate(_write(tmp_path, config), "config.yaml", field, words)


def test_duplicate_key_names_both_lines(small_corpus, tmp_path) -> None:
    text = yaml.safe_dump(base_config(small_corpus, tmp_path / "wd"), sort_keys=False)
    text = text.replace("  workers: 2\n", "  workers: 2\n  workers: 1\n")
    lines = text.splitlines()
    first = lines.index("  workers: 2") + 1
    flat = _validate(_write(tmp_path, text), "config.yaml", "executor.workers", "duplicate key")
    assert f"{first}" in flat and f"{first + 1}" in flat


def test_boolean_is_not_a_number(small_corpus, tmp_path) -> None:
    config = base_config(small_corpus, tmp_path / "wd", executor={"platform": "local", "workers": True})
    _validate(_write(tmp_path, config), "config.yaml", "executor.workers", "True")


def test_alias_bomb_is_refused_quickly(small_corpus, tmp_path) -> None:
    text = yaml.safe_dump(base_config(small_corpus, tmp_path / "wd"), sort_keys=False)
    levels = ["bomb:", "  l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        levels.append(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]")
    started = time.monotonic()
    _validate(_write(tmp_path, text + "\n".join(levels) + "\n"), "config.yaml", "bomb", "alias", timeout=30)
    assert time.monotonic() - started < 5


def test_deep_nesting_is_refused(small_corpus, tmp_path) -> None:
    text = yaml.safe_dump(base_config(small_corpus, tmp_path / "wd"), sort_keys=False)
    _validate(
        _write(tmp_path, text + "deep: " + "[" * 5000 + "]" * 5000 + "\n"), "config.yaml", "deep", "nest"
    )


def test_control_bytes_name_the_field(small_corpus, tmp_path) -> None:
    text = yaml.safe_dump(base_config(small_corpus, tmp_path / "wd"), sort_keys=False)
    text = text.replace("name: test", "name: te\x07st", 1)
    _validate(_write(tmp_path, text), "config.yaml:1", "name", "control character")


def test_a_server_url_without_scheme_or_host_is_refused(small_corpus, tmp_path) -> None:
    """``weaviate:8080`` parses as a scheme with no host: the clients would quietly try 127.0.0.1."""
    databases = [
        {"name": "weaviate", "url": "weaviate:8080"},
        {"name": "qdrant", "mode": "server", "url": "http://qdrant:99999"},
        {"name": "milvus", "uri": "tcpx://milvus:19530"},  # pymilvus takes http(s) and tcp
        {"name": "pgvector", "url": "postgresql://me:secret@db/postgres"},
        {"name": "pgvector", "label": "pg-query", "url": "postgresql://me@db/postgres?password=secret"},
        {"name": "weaviate", "label": "w-tls", "url": "https://weaviate:8443"},  # its client would use http
        {"name": "weaviate", "label": "w-80", "url": "http://weaviate"},  # port 80, or Weaviate's 8080?
    ]
    config = base_config(small_corpus, tmp_path / "wd", vdb={"databases": databases})
    flat = _validate(_write(tmp_path, config), "config.yaml", "vdb.databases.0.url", "'weaviate:8080'")
    assert "vdb.databases.1.url: must be a server URL such as http://host:8080" in flat, flat
    assert "'http://qdrant:99999'" in flat, flat
    milvus = "vdb.databases.2.uri: must be a server URL such as http://host:8080 (http or https or tcp"
    assert milvus in flat, flat
    for index in (3, 4):  # the recorded config would hold the password, and so would the error
        assert f"vdb.databases.{index}.url: must not hold a password" in flat, flat
    assert "secret" not in flat, flat
    assert "vdb.databases.5.url: must be http://host:port" in flat, flat
    assert "vdb.databases.6.url: must name its port" in flat, flat


@pytest.mark.parametrize(
    "url",
    ["http://db:", "http://db:0", "http://[::1]:", "postgresql://db/x?sslpassword=key-secret"],
)
def test_server_url_edge_cases_are_refused(url: str) -> None:
    """An empty port would mean the scheme's default, port 0 none at all; a client key's passphrase in
    the query (libpq's sslpassword=) would be recorded like a password."""
    from executors.safe import check_server_url, no_password_in_url

    with pytest.raises(ValueError) as caught:
        check_server_url(url, ("http", "postgresql"))
    assert "secret" not in str(caught.value)
    assert check_server_url("http://db:8080") == "http://db:8080"
    assert no_password_in_url("postgresql://db/x?sslmode=require") == "postgresql://db/x?sslmode=require"


def test_milvus_token_moved_to_token_env(small_corpus, tmp_path) -> None:
    """A credential written as ``token:`` is refused without being printed; the ``token: ''`` that runs
    recorded before ``token_env`` existed still reads, so their reports can be re-rendered."""
    from apps.vdb.milvus.settings import MilvusSettings

    databases = [{"name": "milvus", "uri": "http://milvus:19530", "token": "root:hunter3"}]
    config = base_config(small_corpus, tmp_path / "wd", vdb={"databases": databases})
    flat = _validate(_write(tmp_path, config), "vdb.databases.0.milvus", "token was replaced by token_env")
    assert "hunter3" not in flat, flat
    assert MilvusSettings.model_validate({"name": "milvus", "token": ""}).token_env is None


def test_directory_as_config_path(tmp_path) -> None:
    folder = tmp_path / "configdir"
    folder.mkdir()
    _validate(folder, "configdir", "is a directory")


def test_blank_terms_file(small_corpus, tmp_path) -> None:
    terms = tmp_path / "blank-terms.txt"
    terms.write_text("\n   \n\t\n\n", encoding="utf-8")
    config = base_config(small_corpus, tmp_path / "wd", queries={"terms_file": str(terms)})
    _validate(_write(tmp_path, config), "config.yaml", "queries.terms_file", "blank-terms.txt", "no term")


def test_groundtruth_k_above_known_rows(small_corpus, tmp_path) -> None:
    """With the dataset already built (its row count known), a k above its rows is refused at plan time."""
    from pipeline.config.loader import load_config
    from pipeline.plan import build_plan

    dataset = tmp_path / "dataset"
    config = base_config(small_corpus, tmp_path / "wd", dataset={"dir": str(dataset)})
    config["groundtruth"]["k"] = 50
    path = _write(tmp_path, config)
    key = build_plan(load_config(path)).stage("embed").key
    dataset.mkdir()  # a complete (empty-listed) dataset of 7 rows made by this very configuration
    made = f'{{"stage": "embed", "key": "{key}", "rows": 7, "files": []}}'
    (dataset / "manifest.json").write_text(made, encoding="utf-8")
    _validate(path, "config.yaml", "groundtruth.k", "7 rows")


def test_empty_corpus_path_item(small_corpus, tmp_path) -> None:
    """``paths: [""]`` used to expand to every file under the config's folder."""
    config = base_config(small_corpus, tmp_path / "wd")
    config["corpus"]["paths"] = [str(small_corpus), ""]
    _validate(_write(tmp_path, config), "config.yaml", "corpus.paths.1", "at least 1 character")


def test_groundtruth_k_above_unknown_rows_is_recorded(tmp_path) -> None:
    """When the rows were unknown at plan time, the cut k is said in the manifest (and logged), not hidden."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from apps.dataset.groundtruth.stage import GroundTruthConfig, compute_groundtruth
    from apps.dataset.layout import vectors_to_arrow
    from tests.evaluate.test_vdb_metrics import write_dataset

    rng = np.random.default_rng(0)
    write_dataset(tmp_path / "ds", rng.standard_normal((7, 784)).astype(np.float32), parts=1)
    queries = rng.standard_normal((3, 784)).astype(np.float32)
    table = pa.table({"id": pa.array(np.arange(3)), "embedding": vectors_to_arrow(queries, "float32")})
    pq.write_table(table, tmp_path / "queries.parquet")
    settings = GroundTruthConfig(k=20, device="cpu", memory_budget_mb=16)
    manifest = compute_groundtruth(
        str(tmp_path / "gt"), str(tmp_path / "ds"), str(tmp_path / "queries.parquet"), settings
    )
    assert (manifest["k"], manifest["k_requested"]) == (7, 20)
    assert "groundtruth.k 20 exceeds the dataset's 7 rows" in manifest["warnings"][0]
