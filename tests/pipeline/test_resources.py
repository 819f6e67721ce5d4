"""The resource plan: each point's memory, data and time, checked against what a node has.

The arithmetic is checked with figures given here; the shipped study configs with the measured figures
(``apps.vdb.resources.COSTS``): every point of ``configs/polaris.yaml`` and ``configs/aurora.yaml`` fits a
node, and the old Fig. 2 entry (the whole Pes2o-VE into one node's /dev/shm) is refused, naming the
point, the estimate and the capacity.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest
import typer
import yaml
from rich.console import Console

from apps.vdb import resources
from apps.vdb.resources import GIB, EngineCost, estimate
from core.errors import ConfigError
from pipeline.cli import output
from pipeline.config.loader import load_config
from pipeline.resources import resource_plan
from tests.conftest import REPO
from tests.pipeline.test_hpc_render import FIXED_ENV

ANN_FMNIST = REPO / "datasets" / "ann" / "fmnist1k"
PES2O_VE = 88_453_763  # rows of the full Pes2o-VE (../shared/papers/000, Table I)


@pytest.fixture
def fixed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in FIXED_ENV.items():
        monkeypatch.setenv(key, value)


def test_the_estimate_follows_the_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cost = EngineCost(memory_copies=1.5, disk_copies=2.0, fixed_mib=100, insert_vectors_per_s=1000,
                      index_vectors_per_s=500)  # fmt: skip
    monkeypatch.setitem(resources.COSTS, ("qdrant", "hnsw", "none"), cost)
    config = yaml.safe_dump({
        "name": "t", "workdir": str(tmp_path),
        "dataset": {"name": "x", "stored": "x"}, "groundtruth": {"k": 10, "metric": "l2"},
        "vdb": {"databases": [{"name": "qdrant", "mode": "edge"}], "collection": {"hnsw_m": 16}},
    })  # fmt: skip
    (tmp_path / "c.yaml").write_text(config)
    (point,) = load_config(tmp_path / "c.yaml").config.vdb.points
    got = estimate(point, rows=1_000_000, dim=768, medium="memory", ranks=4, ranks_per_node=2)
    per_rank = 250_000
    vector, graph = 4 * 768, 2 * 16 * 4 + 8
    assert got.rank_memory == pytest.approx(100 * 2**20 + per_rank * (1.5 * vector + graph))
    assert got.node_disk == pytest.approx(2 * per_rank * (2.0 * vector + graph))
    assert got.node_memory == pytest.approx(2 * got.rank_memory + got.node_disk)  # /dev/shm is memory
    assert got.upload_s == pytest.approx(1_000_000 / (1000 * 384 / 768 * 4))
    assert got.index_s == pytest.approx(per_rank / (500 * 384 / 768))
    on_ssd = estimate(point, rows=1_000_000, dim=768, medium="ssd", ranks=4, ranks_per_node=2)
    assert on_ssd.node_memory == pytest.approx(2 * got.rank_memory)


def test_each_index_and_quantisation_uses_its_own_row_and_an_unmeasured_one_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A measured (engine, index, quantisation) row prices its points with its own copies, rates and links
    (a flat index has no graph, only the 8-byte id); a combination not measured borrows the engine's HNSW
    float32 row and the plan's basis says so."""
    hnsw = EngineCost(memory_copies=2.0, disk_copies=1.0, fixed_mib=0, insert_vectors_per_s=1000,
                      index_vectors_per_s=100)  # fmt: skip
    flat = EngineCost(memory_copies=1.0, disk_copies=3.0, fixed_mib=0, insert_vectors_per_s=4000,
                      index_vectors_per_s=None)  # fmt: skip
    monkeypatch.setitem(resources.COSTS, ("milvus", "hnsw", "none"), hnsw)
    monkeypatch.setitem(resources.COSTS, ("milvus", "flat", "none"), flat)
    monkeypatch.delitem(resources.COSTS, ("milvus", "ivf_pq", "pq"), raising=False)
    entries = [
        {"name": "milvus", "label": "flat", "collection": {"index_type": "flat"}},
        {"name": "milvus", "label": "pq", "collection": {"index_type": "ivf_pq", "quantization": "pq"}},
    ]
    config = yaml.safe_dump({
        "name": "t", "workdir": str(tmp_path),
        "dataset": {"name": "x", "stored": "x"}, "groundtruth": {"k": 10, "metric": "l2"},
        "vdb": {"databases": entries, "collection": {"hnsw_m": 16}},
    })  # fmt: skip
    (tmp_path / "c.yaml").write_text(config)
    by_label = {p.label: p for p in load_config(tmp_path / "c.yaml").config.vdb.points}
    rows, dim = 100_000, 384
    got = estimate(by_label["flat"], rows=rows, dim=dim, medium="ssd", ranks=1, ranks_per_node=1)
    assert got.basis == "milvus flat"
    assert got.rank_memory == pytest.approx(rows * (1.0 * 4 * dim + 8))  # no HNSW links
    assert got.node_disk == pytest.approx(rows * (3.0 * 4 * dim + 8))
    assert got.upload_s == pytest.approx(rows / 4000) and got.index_s is None
    assert got.row()[8] == "none"  # a flat index has nothing to build: not "in upload"
    borrowed = estimate(by_label["pq"], rows=rows, dim=dim, medium="ssd", ranks=1, ranks_per_node=1)
    assert borrowed.basis == "milvus hnsw (ivf_pq, pq: not measured)"
    assert borrowed.rank_memory == pytest.approx(rows * (2.0 * 4 * dim + 8))  # HNSW's copies, IVF's links
    assert borrowed.index_s == pytest.approx(rows / 100)
    assert borrowed.row()[8] == "17 min"  # 100,000 rows at 100 a second


# The study's datasets (../shared/papers/000, Table I) as the configs hold them: (rows, dimension). The
# file's own is Pes2o-VE; Yandex-T2I is its 10M prefix (the largest subset the study loads).
TABLE_I = {
    None: (PES2O_VE, 2560),
    "gist-1m": (1_000_000, 960),
    "dbpedia-openai-1m": (1_000_000, 1536),
    "yandex-t2i": (10_000_000, 200),
}


@pytest.mark.parametrize("platform", ["polaris", "aurora"])
@pytest.mark.parametrize("entry", list(TABLE_I))
def test_every_shipped_study_point_fits_a_node(fixed_env: None, platform: str, entry: str | None) -> None:
    loaded = load_config(REPO / "configs" / f"{platform}.yaml", entry)
    cfg = loaded.config
    assert set(loaded.dataset_entries) == set(TABLE_I) - {None}  # Table I is one config
    assert cfg.dataset.expected_rows == (PES2O_VE if entry is None else None)
    if entry is not None:  # imported: no corpus, no model; its subsets where the set is larger than 1M
        assert cfg.dataset.imported is not None and cfg.corpus is None and cfg.embedding is None
    swept = {p.config.insert.rows for p in cfg.vdb.points}
    if entry in (None, "yandex-t2i"):  # 000's 1M / 5M / 10M subsets (Table IV)
        assert {1_000_000, 5_000_000, 10_000_000} <= swept
    plan = resource_plan(loaded, cfg.vdb.points, *TABLE_I[entry])
    # Nothing that cannot fit (that would be refused); stages the plan expects to outlast their timeouts
    # are warnings (the estimates are lower bounds from this 2-core machine, scaled linearly in cores).
    assert all("exceeds vdb." in line and "cannot fit" not in line for line in plan.warnings)
    if (platform, entry) == ("polaris", None):  # 10M x 2560 indexed by one 8-core rank: hours, not 50 min
        late = "'fig4-workers-qdrant[shards=1,workers=1,nodes=1]': its index build (about 3.1 h) exceeds"
        assert any(late in line for line in plan.warnings)
    node = cfg.executor.node
    measured = [(p, e) for p, e in plan.estimates if e is not None]
    assert {p.database for p, _ in measured} == {"qdrant", "milvus", "weaviate"}
    for point, found in measured:
        assert found.node_memory <= node.memory_gib * GIB, point.label
        if found.medium == "memory":
            assert found.node_disk <= node.shm_gib * GIB, point.label


def edited_polaris(tmp_path: Path, old: str, new: str, name: str = "polaris.yaml") -> tuple[Path, int]:
    """configs/<name> with ``old`` replaced by ``new`` once, in ``tmp_path``: (path, the new line)."""
    text = (REPO / "configs" / name).read_text()
    edited = text.replace(old, new, 1)
    assert edited != text, old
    path = tmp_path / name
    path.write_text(edited.replace("../datasets/", str(REPO / "datasets") + "/"))
    line = next(n for n, text in enumerate(edited.splitlines(), 1) if new.strip() in text)
    return path, line


def refusal(path: Path) -> str:
    """The ConfigError message the resource plan of the Pes2o-VE config at ``path`` ends with."""
    loaded = load_config(path)
    with pytest.raises(ConfigError) as error:
        resource_plan(loaded, loaded.config.vdb.points, PES2O_VE, 2560)
    return str(error.value)


def test_the_old_fig2_entry_is_refused_naming_point_estimate_and_capacity(
    fixed_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fig. 2 as it was: no insert.rows, so all of Pes2o-VE into one node's /dev/shm."""
    path, _ = edited_polaris(tmp_path, "insert: &batch_curve {rows: 1000000, ", "insert: &batch_curve {")
    message = refusal(path)
    assert message.startswith(f"{path}:")
    assert "point 'fig2-media-qdrant[medium=memory]' cannot fit" in message
    assert "of data on /dev/shm per node, a polaris node (executor.node) has 256.0 GiB" in message
    assert "88,453,763 vectors x 2560 over 1 rank(s)" in message and "vdb.resource_check: warn" in message
    # blamed on the entry: the rows are the dataset's, no vdb.insert.rows is written there
    assert re.search(r":\d+: vdb\.databases\.\d+$", message.split(": point")[0]), message
    # the command line prints it whole: the label's brackets are text, not rich markup
    with pytest.raises(typer.Exit):
        output.error(message, 2)
    assert capsys.readouterr().err == f"error: {message}\n"
    # resource_check: warn runs it anyway, saying the same
    path.write_text(
        path.read_text().replace("vdb:\n  databases:", "vdb:\n  resource_check: warn\n  databases:", 1)
    )
    loaded = load_config(path)
    plan = resource_plan(loaded, loaded.config.vdb.points, PES2O_VE, 2560)
    assert any("fig2-media-qdrant[medium=memory]' cannot fit" in line for line in plan.warnings)
    shown = Console(file=io.StringIO(), width=400)  # what validate, plan and run print
    for line in plan.warnings:
        output.warn(line, shown)
    lines = shown.file.getvalue().splitlines()
    assert len(lines) == len(plan.warnings) and all(line.startswith("warning: point '") for line in lines)
    refused = "warning: point 'fig2-media-qdrant[medium=memory]' cannot fit"
    assert any(line.startswith(refused) for line in lines)
    assert all(
        line.endswith("running it anyway (vdb.resource_check: warn)") for line in lines if "fit" in line
    )


def test_clients_and_the_driver_are_estimated(fixed_env: None) -> None:
    """A client process holds one row group or its queries, and as many share a client node as an insert
    task starts (workers x clients_per_worker); the driver adds the report's prefix truth and vectors."""
    mib = 2**20
    one_group = resources.client_memory(dim=2560, row_group_rows=4096, queries=10, k=10)
    assert one_group == pytest.approx(resources.CLIENT_FIXED_MIB * mib + 3 * 4096 * 2560 * 4)
    many_queries = resources.client_memory(dim=2560, row_group_rows=4096, queries=22723, k=10)
    assert many_queries == pytest.approx(resources.CLIENT_FIXED_MIB * mib + 22723 * (2 * 2560 * 4 + 120))
    loaded = load_config(REPO / "configs" / "polaris.yaml")
    plan = resource_plan(loaded, loaded.config.vdb.points, PES2O_VE, 2560, queries=2000)
    served = {p.label: e for p, e in plan.estimates if e is not None}
    sent = resources.client_memory(dim=2560, row_group_rows=4096, queries=2000, k=10)  # 2,000 < max_queries
    assert all(e.client_memory == pytest.approx(sent) for e in served.values())
    # the main points: 10 insert workers on 16-worker client nodes, 4 clients each -> 40 processes
    assert served["qdrant"].client_processes == 40
    assert served["fig2-media-qdrant[medium=memory]"].client_processes == 1  # one worker, one client
    assert plan.prefix_truth  # Fig. 2 loads 1M of the 88M rows: the report computes that prefix's truth
    budget = loaded.config.groundtruth.memory_budget_mb
    fetched = 2 * 2000 * 10 * 4 * 2560  # returned ids and the exact top-10 of 2,000 queries
    assert plan.driver_memory == pytest.approx((resources.DRIVER_MEASURED_MIB + budget) * mib + fetched)


def test_a_client_node_that_cannot_hold_its_clients_is_refused(fixed_env: None, tmp_path: Path) -> None:
    path, line = edited_polaris(tmp_path, "    clients_per_worker: 4\n", "    clients_per_worker: 1024\n")
    message = refusal(path)
    assert message.startswith(f"{path}:{line}: vdb.insert.clients_per_worker: point 'qdrant' cannot fit:")
    assert "for its 10240 client processes (about " in message
    assert ") on one client node, a polaris node" in message
    assert "lower vdb.insert.clients_per_worker, vdb.query.clients or vdb.query.max_queries" in message


def test_local_clients_beyond_this_machine_are_refused_at_their_field(tmp_path: Path) -> None:
    """Locally the clients share the machine with the database: 100,000 query clients (a process each)
    were planned without a word; they are refused at vdb.query.clients, beside the database's memory."""
    text = (REPO / "configs" / "local-ann.yaml").read_text().replace("../datasets/", f"{REPO}/datasets/")
    path = tmp_path / "local-ann.yaml"
    path.write_text(text.replace("    clients: [1]\n", "    clients: [100000]\n", 1))
    line = next(n for n, t in enumerate(path.read_text().splitlines(), 1) if "clients: [100000]" in t)
    loaded = load_config(path)
    with pytest.raises(ConfigError) as error:
        resource_plan(loaded, loaded.config.vdb.points, 1000, 784, 500)
    message = str(error.value)
    assert message.startswith(f"{path}:{line}: vdb.query.clients: point 'milvus' cannot fit:"), message
    assert "for its 100000 client processes (about " in message
    assert "beside the database's " in message and ", this machine has " in message


def test_ground_truth_blocks_beyond_a_gpus_memory_are_refused(fixed_env: None, tmp_path: Path) -> None:
    path, line = edited_polaris(tmp_path, "  memory_budget_mb: 16384\n", "  memory_budget_mb: 65536\n")
    message = refusal(path)
    assert message.startswith(f"{path}:{line}: groundtruth.memory_budget_mb: blocks of 65,536 MiB")
    assert "one GPU of a polaris node (executor.node.gpu_memory_gib) has 40 GiB" in message


def test_a_local_plan_prints_the_resource_table(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    result = run_cli(
        "plan", str(REPO / "configs" / "local-ann.yaml"), env={"PIPELINE_WORKDIR": str(tmp_path)}
    )
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("resource plan", 1)[1]
    for engine in ("qdrant", "milvus", "weaviate", "faiss"):
        assert f"│ {engine}" in table
    assert "1,000 x 784" in table
    assert "│ 226.8 MiB x 2" in table  # milvus: one insert worker, two client processes
    assert "memory/client: each client process (x how many share a client node)" in result.stdout
    # fmnist1k's own count
    assert "or the dataset's 500 queries (vdb.query.max_queries, where fewer)" in result.stdout
    assert "driver (the DAG and the report): about 3" in result.stdout


def test_a_local_weaviate_cluster_counts_each_of_its_processes(tmp_path: Path) -> None:
    """local-study's `nodes: [1, 2, 3]` starts 1, 2, 3 Weaviate processes here: each holds its own
    fixed memory (the plan counted one), and together they upload no faster than one on these cores."""
    from tests.conftest import run_cli

    result = run_cli(
        "plan", str(REPO / "configs" / "local-study.yaml"), env={"PIPELINE_WORKDIR": str(tmp_path)}
    )
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("resource plan", 1)[1]
    rows = {
        nodes: next(line for line in table.splitlines() if f"weaviate-nodes[nodes={nodes}," in line)
        for nodes in (1, 3)
    }
    cells = {nodes: [c.strip() for c in line.split("│")] for nodes, line in rows.items()}
    assert cells[1][3] == "1 (1/node)" and cells[3][3] == "3 (3/node)", rows
    one, three = (float(cells[n][5].split()[0]) for n in (1, 3))  # memory/node, MiB
    assert three > 2.5 * one, rows  # three processes' fixed memory, not one's
    assert cells[1][8] == cells[3][8], rows  # the upload time


def test_the_resource_table_shows_swept_labels_whole(tmp_path: Path) -> None:
    """A swept point's label holds brackets (``faiss[hnsw_m=32]``): the table prints them as text."""
    from tests.conftest import run_cli

    config = yaml.safe_load((REPO / "configs" / "local-ann.yaml").read_text())
    config["dataset"]["imported"]["paths"] = [str(REPO / "datasets" / "ann" / "fmnist1k")]
    config["vdb"]["collection"]["hnsw_m"] = [16, 32]
    config.pop("datasets", None)
    path = tmp_path / "swept.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_cli("plan", str(path), env={"PIPELINE_WORKDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("resource plan", 1)[1]
    for engine in ("qdrant", "milvus", "weaviate", "faiss"):
        assert f"│ {engine}[hnsw_m=16]" in table and f"│ {engine}[hnsw_m=32]" in table, table


def test_a_full_disk_is_named_with_where_and_the_estimate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A library's own words for a full disk ("basic_ios::clear: iostream error") become a message that
    says the disk is full, where, how much is free and what the resource plan estimated."""
    import shutil
    from collections import namedtuple

    from pipeline import workflow
    from pipeline.plan import build_plan

    config = {
        "name": "full", "workdir": str(tmp_path),
        "dataset": {"name": "fm", "imported": {"format": "vecs", "paths": [str(ANN_FMNIST)]}},
        "groundtruth": {"k": 10, "metric": "l2"},
        "vdb": {"databases": [{"name": "faiss"}], "query": {"k": [10]}},
    }  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    plan = build_plan(load_config(tmp_path / "c.yaml"))
    error = RuntimeError("basic_ios::clear: iostream error")
    assert workflow.disk_full_error(plan, error) is None  # this disk is not full
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage(10 * GIB, 10 * GIB - 2**20, 2**20))
    message = str(workflow.disk_full_error(plan, error))
    assert message.startswith(f"the disk holding {tmp_path} ran out of space (1.0 MiB free now of 10.0 GiB)")
    assert "model cache, dataset and ground truth there, and up to" in message
    assert "of database data per point (the resource plan's estimate)" in message
    assert "stopped with RuntimeError: basic_ios::clear: iostream error" in message
    # On that nearly full disk, an error that is not a failed write is not blamed on the disk.
    assert workflow.disk_full_error(plan, ValueError("could not convert string to float: 'x'")) is None
    assert workflow.disk_full_error(plan, ConfigError("vdb.k: bad")) is None  # says what happened already


def test_local_cores_beyond_this_machine_are_refused_at_plan(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """vdb.cores_per_worker beyond the CPUs the run may use was refused only when the point deployed, after
    the dataset was built: plan names the field's line. Points measured already are not checked."""
    too_many = len(os.sched_getaffinity(0)) + 1
    text = (REPO / "configs" / "local-ann.yaml").read_text().replace("../datasets/", f"{REPO}/datasets/")
    path = tmp_path / "local-ann.yaml"
    path.write_text(text.replace("  collection:\n", f"  cores_per_worker: {too_many}\n  collection:\n", 1))
    line = next(n for n, t in enumerate(path.read_text().splitlines(), 1) if "cores_per_worker:" in t)
    from pipeline.plan import build_plan

    with pytest.raises(ConfigError) as error:
        build_plan(load_config(path))
    assert str(error.value).startswith(
        f"{path}:{line}: vdb.cores_per_worker: point 'qdrant': vdb.cores_per_worker is {too_many} but this "
        "machine lets the run use"
    ), str(error.value)
    # Points measured already (on a larger machine) are reused here: nothing to refuse.
    from pipeline.sweep import PointPlan

    monkeypatch.setattr(PointPlan, "complete", property(lambda _point: True))
    assert build_plan(load_config(path)).points


def test_a_local_ground_truth_device_this_machine_lacks_is_refused(
    monkeypatch: pytest.MonkeyPatch, write_config, small_corpus, tmp_path: Path
) -> None:
    """groundtruth.device: cuda on a machine without CUDA failed in the stage, after the dataset was built."""
    import torch

    from tests.conftest import base_config

    path = write_config(base_config(small_corpus, tmp_path, groundtruth={"device": "cuda"}))
    loaded = load_config(path)
    line = next(n for n, t in enumerate(path.read_text().splitlines(), 1) if "device: cuda" in t)
    for has_cuda in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda has=has_cuda: has)
        if has_cuda:
            resource_plan(loaded, [], None, 384)  # a machine with CUDA: nothing to say
            continue
        with pytest.raises(ConfigError) as error:
            resource_plan(loaded, [], None, 384)
        refused = "groundtruth.device: cuda: this machine has no cuda device; use auto or cpu"
        assert str(error.value) == f"{path}:{line}: {refused}"
        resource_plan(loaded, [], None, 384, truth_done=True)  # made elsewhere: reused on any machine


def test_a_query_sweep_longer_than_its_jobs_walltime_is_named(fixed_env: None, tmp_path: Path) -> None:
    """Fig. 2's one setting made 400 (ef values), 30 s each: 3.3 h of measured windows, one task of
    a client block whose walltime is 3 h. The shipped one setting warns of nothing of the kind."""
    one = "query: &one_setting {ef: [128], batch_size: [32], duration_s: 30}"
    efs = ", ".join(str(ef) for ef in range(16, 416))
    many = f"query: &one_setting {{ef: [{efs}], batch_size: [32], duration_s: 30}}"
    path, _ = edited_polaris(tmp_path, one, many)
    loaded = load_config(path)
    plan = resource_plan(loaded, loaded.config.vdb.points, PES2O_VE, 2560)
    long = [line for line in plan.warnings if "query settings take" in line]
    assert long and all("400 query settings take at least 3.3 h" in line for line in long), plan.warnings
    assert "more than its client block's walltime (03:00:00)" in long[0]
    shipped = load_config(REPO / "configs" / "polaris.yaml")
    assert not any("query settings take" in line for line in resource_plan(
        shipped, shipped.config.vdb.points, PES2O_VE, 2560).warnings)  # fmt: skip


def test_one_allocations_points_are_timed_together(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Under executor.allocation: one, the points run one after another inside the one job: the Slurm
    testbed's three points at 150 s per query setting (4 + 8 + 8 settings, 50 min of windows) outlast its
    40 min walltime, though each alone fits. Each block's walltime is not the bound there; the job's is."""
    old, new = "duration_s: 3 ", "duration_s: 150 "
    path, _ = edited_polaris(tmp_path, old, new, name="slurm-local.yaml")
    for allocation, warned in (("separate", False), ("one", True)):
        monkeypatch.setenv("ALLOCATION", allocation)
        loaded = load_config(path)
        for rows in (None, 8580):  # before the dataset exists, and with its rows (plus upload and index)
            plan = resource_plan(loaded, loaded.config.vdb.points, rows, 384)
            late = [line for line in plan.warnings if "walltime" in line]
            if not warned:
                assert late == [], late
                continue
            assert len(late) == 1, late
            assert late[0].startswith("the 3 point(s) to run take at least 50 min of measured query windows")
            assert "more than its walltime (00:40:00, executor.walltime)" in late[0]
            assert ("of upload and index by the resource plan" in late[0]) == (rows is not None)
    monkeypatch.setenv("ALLOCATION", "one")
    fits = load_config(REPO / "configs" / "slurm-local.yaml")  # as shipped: 3 s windows
    assert not [w for w in resource_plan(fits, fits.config.vdb.points, 8580, 384).warnings if "walltime" in w]
    # Workers take no task in the job's last drain_margin_s: 20 settings x 110 s (37 min) fit 40 min, not
    # 40 min less a 10 min margin.
    path, _ = edited_polaris(tmp_path, old, "duration_s: 110 ", name="slurm-local.yaml")
    for margin, warned in (("null", False), ("600", True)):
        text = re.sub(r"drain_margin_s: \S+", f"drain_margin_s: {margin}", path.read_text(), count=1)
        path.write_text(text)
        loaded = load_config(path)
        plan = resource_plan(loaded, loaded.config.vdb.points, None, 384)
        late = [w for w in plan.warnings if "walltime" in w]
        assert len(late) == warned, late
    assert "(00:40:00, executor.walltime), less its 10 min drain margin (executor.drain_margin_s)" in late[0]
    # A margin that leaves a job less than a minute: its workers would take tasks for 60 s only.
    path.write_text(path.read_text().replace("drain_margin_s: 600", "drain_margin_s: 2370", 1))
    loaded = load_config(path)
    drains = [w for w in resource_plan(loaded, loaded.config.vdb.points, None, 384).warnings if "drain" in w]
    assert drains[0] == (
        "executor.drain_margin_s (2,370 s) is not below the walltime of the one allocation (00:40:00) by a "
        "minute: its workers take tasks for their first 60 s only; lower executor.drain_margin_s or ask a "
        "longer walltime"
    ), drains


def test_rows_beyond_the_expected_count_of_a_dataset_still_to_make_are_warned_of(
    write_config, small_corpus, tmp_path: Path
) -> None:
    """A generated dataset's rows are counted once it is made (after embedding), where check_rows refuses
    an insert.rows or a groundtruth.k beyond them: before that, dataset.expected_rows warns at plan."""
    from tests.conftest import base_config, run_cli

    vdb = {"databases": [{"name": "faiss"}], "insert": {"rows": [500, 5000]}, "query": {"ef": [16]}}
    config = base_config(small_corpus, tmp_path / "wd", vdb=vdb, groundtruth={"k": 2000, "metric": "cosine"})
    config["dataset"] = {"expected_rows": 1000}
    result = run_cli("plan", str(write_config(config)))
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert "groundtruth.k: 2,000 neighbours are more than dataset.expected_rows (1,000): refused once" in said
    assert "vdb.insert.rows.1: 5,000 rows (point 'faiss[rows=5000]') are more than" in said
    assert "rows=500'" not in said  # within the count: no word
