"""One config, several datasets: the ``datasets`` section (pipeline/config/variants.py) and ``--dataset``."""

from __future__ import annotations

import pytest
import yaml

from core.errors import ConfigError
from pipeline.config.loader import load_config
from tests.conftest import REPO, base_config, run_cli

ANN = REPO / "datasets" / "ann"


def study(small_corpus, tmp_path, **entry_sections) -> dict:
    """A generated-dataset config with one entry ``gist`` that imports fmnist1k (L2) instead."""
    config = base_config(small_corpus, tmp_path)
    config["corpus"]["paths"] = ["${CORPUS_ONLY_THE_FILE_USES}"]  # unset: an entry must not need it
    config["dataset"] = {"name": "pes2o", "expected_rows": 88453763}
    config["datasets"] = {
        "gist": {
            "dataset": {
                "name": "fm-as-gist",
                "imported": {"format": "vecs", "paths": [str(ANN / "fmnist1k")]},
            },
            "groundtruth": {"k": 10, "metric": "l2"},
            **entry_sections,
        }
    }
    return config


def test_an_entry_replaces_the_dataset_drops_the_generating_sections_and_merges_the_rest(
    write_config, small_corpus, tmp_path
) -> None:
    path = write_config(study(small_corpus, tmp_path, executor={"workers": 1}))
    loaded = load_config(path, "gist")
    cfg = loaded.config
    assert loaded.dataset_entry == "gist" and loaded.dataset_entries == ("gist",)
    assert cfg.name == "test-gist"  # the file's name, with the entry's
    assert cfg.dataset.name == "fm-as-gist" and cfg.dataset.expected_rows is None  # replaced, not merged
    assert cfg.corpus is None and cfg.embedding is None and cfg.queries is None  # a given dataset's run
    assert (cfg.groundtruth.k, cfg.groundtruth.metric) == (10, "l2")
    assert cfg.executor.workers == 1 and cfg.executor.platform == "local"  # merged into the file's
    # The resolved config is an ordinary one: it validates again without the file (report rewrites it).
    again = write_config(loaded.resolved_dict(), "recorded.yaml")
    assert load_config(again).config == cfg


def test_the_files_own_dataset_ignores_the_entries_but_lists_them(
    write_config, small_corpus, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("CORPUS_ONLY_THE_FILE_USES", str(small_corpus))
    loaded = load_config(write_config(study(small_corpus, tmp_path)))
    assert loaded.dataset_entry is None and loaded.dataset_entries == ("gist",)
    assert loaded.config.name == "test" and loaded.config.dataset.expected_rows == 88453763


def test_null_removes_a_section_and_a_list_replaces(write_config, small_corpus, tmp_path) -> None:
    # the file's list reads a variable the entry's list does not: replaced, it need not be set
    replaced = {"name": "qdrant", "mode": "edge", "local_path": "${ONLY_THE_REPLACED_LIST_USES}"}
    vdb = {"databases": [{"name": "faiss"}, replaced], "query": {"ef": [16]}}
    config = study(small_corpus, tmp_path, vdb={"databases": [{"name": "faiss"}]})
    config["vdb"] = vdb
    config["datasets"]["plain"] = {**config["datasets"]["gist"], "vdb": None}
    path = write_config(config)
    gist = load_config(path, "gist").config.vdb
    assert [db.name for db in gist.databases] == ["faiss"] and gist.query.ef == [16]
    assert load_config(path, "plain").config.vdb is None


def test_an_error_inside_an_entry_names_the_entry_and_its_line(write_config, small_corpus, tmp_path) -> None:
    config = study(small_corpus, tmp_path, groundtruth={"k": "many", "metric": "l2"})
    path = write_config(config)
    with pytest.raises(ConfigError) as info:
        load_config(path, "gist")
    text = str(info.value)
    k_line = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if "k: many" in line)
    assert f"config.yaml:{k_line}: dataset gist: groundtruth.k: " in text


def test_a_plan_error_of_an_entry_points_into_the_entry(write_config, small_corpus, tmp_path) -> None:
    config = study(small_corpus, tmp_path, groundtruth={"k": 5000, "metric": "l2"})  # fmnist1k: 1,000 rows
    path = write_config(config)
    result = run_cli("validate", str(path), "--dataset", "gist")
    assert result.returncode == 2
    k_line = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if "k: 5000" in line)
    expected = (
        f"config.yaml:{k_line}: dataset gist: groundtruth.k: 5000 neighbours asked of a dataset of 1000"
    )
    assert expected in result.stderr


@pytest.mark.parametrize(
    ("sections", "typo", "field"),
    [
        ({"groundtruth": {"k": 10, "metrc": "l2"}}, "metrc: l2", "groundtruth.metrc"),
        (
            {"vdb": {"databases": [{"name": "faiss", "indx_type": "flat"}]}},
            "indx_type",
            "vdb.databases.0.indx_type",
        ),
        ({"executor": {"workrs": 1}}, "workrs", "executor.workrs"),  # inside a union: the platform's model
    ],
)
def test_a_misspelt_field_inside_an_entry_is_refused_by_every_command(
    write_config, small_corpus, tmp_path, monkeypatch, sections, typo, field
) -> None:
    """Not only when the entry runs: `validate FILE` (the file's own dataset) and `run --dataset all`
    (which would run the file's dataset first) refuse it up front, naming the entry, field and line."""
    monkeypatch.setenv("CORPUS_ONLY_THE_FILE_USES", str(small_corpus))
    path = write_config(study(small_corpus, tmp_path, **sections))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if typo in text)
    with pytest.raises(ConfigError) as info:
        load_config(path)  # the file's own dataset
    assert f"config.yaml:{line}: dataset gist: {field}: unknown field" in str(info.value)
    result = run_cli("validate", str(path))
    assert result.returncode == 2 and f"dataset gist: {field}: unknown field" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_key_written_over_a_yaml_merge_is_named_at_its_own_line(write_config, small_corpus, tmp_path):
    """PyYAML puts a merge's (``<<: *anchor``) keys before the mapping's own: the error points at the key
    the mapping writes, not at the anchor's."""
    text = yaml.safe_dump(base_config(small_corpus, tmp_path), sort_keys=False)
    fm = str(ANN / "fmnist1k")
    text += (
        "datasets:\n"
        f"  one: {{dataset: {{stored: x}}, groundtruth: &gt {{k: 10, metric: l2}}}}\n"
        f"  two:\n    dataset: {{imported: {{format: vecs, paths: [{fm}]}}}}\n"
        "    groundtruth:\n      <<: *gt\n      k: many\n"
    )
    path = write_config(text)
    line = next(i for i, row in enumerate(path.read_text().splitlines(), 1) if "k: many" in row)
    with pytest.raises(ConfigError) as info:
        load_config(path, "two")
    assert f"config.yaml:{line}: dataset two: groundtruth.k: " in str(info.value)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ("[a, b]", "datasets: a mapping of dataset entries"),
        ("{all: {dataset: {name: x, stored: x}}}", "'all' is reserved"),
        ("{'bad name': {dataset: {name: x, stored: x}}}", "is not a dataset entry name"),
        ("{gist: {groundtruth: {k: 5}}}", "an entry needs its own dataset: section"),
        ("{gist: {dataset: {stored: x}, vbd: {}}}", r"'vbd' is not a section of a config \(sections: name,"),
    ],
)
def test_a_malformed_datasets_section_is_refused(write_config, small_corpus, tmp_path, entries, message):
    text = yaml.safe_dump(base_config(small_corpus, tmp_path), sort_keys=False) + f"datasets: {entries}\n"
    with pytest.raises(ConfigError, match=message):
        load_config(write_config(text))


def test_cli_dataset_option(write_config, small_corpus, tmp_path, monkeypatch) -> None:
    path = write_config(study(small_corpus, tmp_path))
    env = {"CORPUS_ONLY_THE_FILE_USES": str(small_corpus)}
    every = run_cli("validate", str(path), "--dataset", "all", env=env)
    assert every.returncode == 0, every.stderr
    assert "valid: " in every.stdout and "dataset gist (hash" in every.stdout
    own = run_cli("validate", str(path), env=env)
    assert own.returncode == 0 and "other datasets in this config: gist" in own.stdout
    unknown = run_cli("plan", str(path), "--dataset", "glove", env=env)
    assert unknown.returncode == 2
    assert (
        "--dataset 'glove': not an entry of the config's datasets section (entries: gist;" in unknown.stderr
    )
    assert "leave --dataset out, or name pes2o, for the file's own dataset" in unknown.stderr
    assert "Traceback" not in unknown.stderr and not (tmp_path / "store").exists()
    monkeypatch.setenv("CORPUS_ONLY_THE_FILE_USES", str(small_corpus))
    by_name = load_config(path, "pes2o")  # the file's own dataset by its name: as without --dataset
    assert by_name.dataset_entry is None and by_name.config_hash == load_config(path).config_hash


def test_dataset_all_checks_every_dataset_and_lists_the_failed(write_config, small_corpus, tmp_path) -> None:
    config = study(small_corpus, tmp_path)
    config["datasets"] = {
        "broken": {"dataset": {"imported": {"format": "vecs", "paths": [str(tmp_path / "missing")]}}},
        **config["datasets"],
    }
    path = write_config(config)
    env = {"CORPUS_ONLY_THE_FILE_USES": str(small_corpus)}
    result = run_cli("validate", str(path), "--dataset", "all", env=env)
    assert result.returncode == 2
    assert "dataset broken: dataset.imported.paths:" in result.stderr  # named, and the others still checked
    assert "valid: " in result.stdout and "dataset gist (hash" in result.stdout
    assert "1 of 3 dataset(s) failed: broken" in result.stderr
    assert "other datasets in this config" not in result.stdout  # --dataset all ran them
    # The file's own dataset failing (its corpus variable unset) does not stop the entries either.
    without_corpus = run_cli("validate", str(path), "--dataset", "all")
    assert without_corpus.returncode == 2 and "dataset gist (hash" in without_corpus.stdout
    assert "2 of 3 dataset(s) failed: the file's own, broken" in without_corpus.stderr


def test_an_entrys_dataset_is_named_after_it_unless_it_says(write_config, small_corpus, tmp_path) -> None:
    config = study(small_corpus, tmp_path)
    config["datasets"]["fm"] = {"dataset": {"imported": {"format": "vecs", "paths": [str(ANN / "fmnist1k")]}}}
    path = write_config(config)
    assert load_config(path, "fm").config.dataset.name == "fm"
    assert load_config(path, "gist").config.dataset.name == "fm-as-gist"


def test_an_entry_with_nothing_to_make_its_dataset_from_is_refused(write_config, tmp_path) -> None:
    config = {
        "name": "ann",
        "workdir": str(tmp_path),
        "dataset": {"name": "fm", "imported": {"format": "vecs", "paths": [str(ANN / "fmnist1k")]}},
        "groundtruth": {"k": 10, "metric": "l2"},
        "datasets": {"gen": {"dataset": {"name": "gen"}}},  # no files, and the file has no corpus
    }
    with pytest.raises(ConfigError, match=r"datasets.gen: its dataset names neither imported nor stored"):
        load_config(write_config(config))
