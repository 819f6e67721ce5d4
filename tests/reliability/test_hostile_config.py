"""Hostile config values: every value that reaches a job script, a command line or an env file is either
rejected by ``validate`` (exit 2, file:line and the field named) or rendered inert by ``plan``.

Each hostile value tries to create a marker file (``touch``) through shell syntax or a line break; the
tests also assert that the marker never appears.
"""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from apps.vdb.cluster.layout import node_shape, plan_cluster
from apps.vdb.cluster.render import _dq, write_files
from pipeline.config.loader import load_config
from tests.conftest import run_cli
from tests.executors.test_hpc_config import hpc_env, study, write  # noqa: F401  (hpc_env is a fixture)

M = "{marker}"  # replaced by the test's marker path

# (platform, dotted field path as written in the YAML, hostile value)
REJECTED: list[tuple[str, str, Any]] = [
    # login node: Parsl runs `qsub -q QUEUE -A ACCOUNT script` through a shell
    ("polaris", "executor.account", f"abc; touch {M}"),
    ("polaris", "executor.queue", f"$(touch {M})"),
    ("polaris", "executor.gpu.queue", f"`touch {M}`"),
    ("polaris", "vdb.cluster.queue", f"prod && touch {M}"),
    ("slurm", "executor.account", f"abc\ntouch {M}"),
    ("slurm", "executor.partition", f"gpu\ntouch {M}"),
    ("slurm", "executor.qos", f"normal\ntouch {M}"),
    ("slurm", "executor.constraint", f"gpu\ntouch {M}"),
    # #PBS / #SBATCH header: a newline ends the directive and starts a command
    ("polaris", "executor.select_options", f"ngpus=4\ntouch {M}"),
    ("polaris", "executor.gpu.select_options", f"ngpus=4 $(touch {M})"),
    ("polaris", "vdb.cluster.select_options", f"ngpus=4\ntouch {M}"),
    ("polaris", "executor.filesystems.1", f"eagle\ntouch {M}"),
    ("polaris", "executor.place", f"scatter\ntouch {M}"),
    ("polaris", "executor.walltime", "01:00:00\n"),  # '$' also matched before a final newline
    ("polaris", "executor.scheduler_options.0", f"#PBS -l foo=bar\ntouch {M}"),
    ("polaris", "executor.scheduler_options.0", f"touch {M}"),
    ("slurm", "executor.scheduler_options.0", f"touch {M}"),
    ("polaris", "vdb.cluster.scheduler_options.0", f"#PBS -l foo\ntouch {M}"),
    ("polaris", "vdb.cluster.scheduler_options.0", "#SBATCH --exclusive"),  # not this platform's
    # launcher line and worker command (an unquoted here-document)
    ("polaris", "executor.gpu.bind_cmd", f"--cpu-bind; touch {M};"),
    ("polaris", "executor.gpu.launcher_overrides", f"--ppn 1; touch {M}"),
    ("polaris", "executor.cpu.launcher_overrides", f"--ppn 1 $(touch {M})"),
    ("slurm", "executor.gpu.launcher_overrides", f"--mpi=pmi2 | touch {M}"),
    ("polaris", "executor.gpu.cpu_affinity", "block\n"),  # the worker command would end there
    ("aurora", "executor.gpu.accelerators.0", f"0.0 $(touch {M})"),
    ("polaris", "executor.interface", f"bond0;touch {M}"),
    ("local", "executor.address", f"127.0.0.1 $(touch {M})"),
    ("polaris", "workdir", f"/tmp/wd-$(touch {M})"),
    # rank scripts and bind specs
    ("polaris", "vdb.cluster.interface", f"hsn0 $(touch {M})"),
    ("polaris", "vdb.cluster.apptainer", f"apptainer$(touch {M})"),
    ("polaris", "vdb.cluster.apptainer_args.0", f"--bind\ntouch {M}"),
    ("polaris", "vdb.cluster.storage.memory_path", f"/dev/shm/$(touch {M})"),
    ("polaris", "vdb.cluster.storage.ssd_path", f"/local/`touch {M}`"),
    ("polaris", "vdb.cluster.storage.lustre_path", "/lus/a:/etc"),  # a second bind target
    ("polaris", "vdb.cluster.overrides.milvus.storage.lustre_path", f"/lus/$(touch {M})"),
    ("polaris", "vdb.cluster.images.qdrant", f"/images/q$(touch {M}).sif"),
    ("polaris", "vdb.cluster.images.etcd", "--writable"),  # would read as an option
    ("aurora", "vdb.cluster.overrides.milvus.storage.daos.pool", f"pool;touch {M}"),
    ("aurora", "vdb.cluster.overrides.milvus.storage.daos.container", f"cont $(touch {M})"),
    ("aurora", "vdb.cluster.overrides.milvus.storage.daos.mount", f"/tmp/$(touch {M})"),
    ("aurora", "vdb.cluster.overrides.milvus.storage.daos.filesystem", f"daos\ntouch {M}"),
    # env files and milvus.yaml
    ("polaris", "vdb.databases.1.env", {f"A=$(touch {M})": "1"}),
    ("polaris", "vdb.databases.2.env", {"GODEBUG": f"x=1\ntouch {M}"}),
    ("polaris", "vdb.databases.1.config_overrides", {"a b": 1}),
]


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """data[a][b][0]... = value, creating missing mappings and lists on the way."""
    parts: list[Any] = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    node: Any = data
    for part, following in itertools.pairwise(parts):
        empty: Any = [] if isinstance(following, int) else {}
        if isinstance(part, int):
            while len(node) <= part:
                node.append(empty)
        elif node.get(part) is None:
            node[part] = empty
        node = node[part]
    last = parts[-1]
    if isinstance(last, int):
        while len(node) <= last:
            node.append(None)
    node[last] = value


# Checked as a whole (an int or a list of ids): the error names the field, the message the id.
REPORTED_AS = {"executor.gpu.accelerators.0": "executor.gpu.accelerators"}


def shown_path(dotted: str, data: dict[str, Any]) -> str:
    """The field path as the error names it: as the file writes it (no union tag: platform, database)."""
    return REPORTED_AS.get(dotted, dotted)


def _fill(value: Any, marker: Path) -> Any:
    if isinstance(value, dict):
        return {_fill(k, marker): _fill(v, marker) for k, v in value.items()}
    return value.replace(M, str(marker)) if isinstance(value, str) else value


def _pass_other_checks(data: dict[str, Any], field: str, value: Any, config_dir: Path) -> None:
    """Make the hostile value pass the checks that predate the shell checks (so those alone decide)."""
    if field.endswith("queue"):
        data["executor"].pop("queues", None)  # an unknown queue would be refused for that reason
        write(config_dir.parent, data)
    if field.endswith("lustre_path"):
        Path(value).mkdir(parents=True, exist_ok=True)  # the path must exist
    if ".images." in field:
        image = config_dir / value
        image.parent.mkdir(parents=True, exist_ok=True)
        image.write_bytes(b"SIF")  # the image file must exist


def _local_config() -> dict[str, Any]:
    data = study("polaris")
    data["executor"] = {"platform": "local", "workers": 1}
    del data["vdb"]["cluster"]
    return data


@pytest.mark.parametrize(("platform", "field", "value"), REJECTED, ids=[f"{p}:{f}" for p, f, _ in REJECTED])
def test_validate_rejects_hostile_value(hpc_env: Path, platform: str, field: str, value: Any) -> None:  # noqa: F811
    marker = hpc_env / "MARKER"
    data = _local_config() if platform == "local" else study(platform)
    value = _fill(value, marker)
    set_path(data, field, value)
    config = write(hpc_env, data)
    _pass_other_checks(data, field, value, config.parent)
    result = run_cli("validate", str(config))
    assert result.returncode == 2, result.stdout + result.stderr
    err = " ".join(result.stderr.split())  # the console may wrap long lines
    # one problem reads file:line: field; several are listed under the first's, each "line N: field"
    assert re.search(
        rf"{re.escape(config.name)}:\d+: (.*?line \d+: )?{re.escape(shown_path(field, data))}\b", err
    ), err
    assert "Traceback" not in result.stderr
    assert not marker.exists()


def test_a_workdir_under_an_unsafe_current_directory_is_refused(hpc_env: Path) -> None:  # noqa: F811
    """A relative workdir resolves against the current directory, which may hold a space or a '$'."""
    data = study("polaris")
    data["workdir"] = "wd"
    config = write(hpc_env, data)
    cwd = hpc_env / "my runs"
    cwd.mkdir()
    result = run_cli("validate", str(config), cwd=cwd)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "workdir" in result.stderr and "cannot be written into job scripts" in result.stderr


# --- free text that is quoted instead: rendered inert ------------------------------------------------------

STUB_LIB = """\
VDB_JOB=stub
vdb_addr() { echo 127.0.0.1; }
vdb_wait_rank0() { VDB_RANK0_ADDR=127.0.0.2; }
vdb_render() { :; }
vdb_serve() { printf '%s\\n' "$@" > "$VDB_RANK_DIR.argv"; }
"""


def _render(hpc_env: Path, data: dict[str, Any], database: str) -> Path:  # noqa: F811
    """Render ``database``'s rank scripts under hpc_env/server with a stub lib.sh; the cluster directory."""
    data["vdb"]["cluster"]["storage"]["memory_path"] = str(hpc_env / "shm")
    loaded = load_config(write(hpc_env, data))
    cfg = loaded.config
    settings = next(s for s in cfg.vdb.databases if s.name == database)
    cluster = cfg.vdb.cluster.for_database(database)
    layout = plan_cluster(settings, cluster, node_shape(cfg.executor), hpc_env / "server", loaded.base_dir)
    write_files(layout, cluster)
    (layout.directory / "lib.sh").write_text(STUB_LIB)
    return layout.directory


HOSTILE_WORDS = [f"$(touch {M})", f"`touch {M}`", f"'; touch {M}; '", f'"; touch {M}; "', f"x; touch {M}"]


@pytest.mark.parametrize("hostile", HOSTILE_WORDS)
def test_apptainer_args_are_quoted_in_the_rank_scripts(hpc_env: Path, hostile: str) -> None:  # noqa: F811
    marker = hpc_env / "MARKER"
    word = hostile.replace(M, str(marker))
    data = study("polaris")
    data["vdb"]["cluster"]["apptainer_args"] = ["--bind", "/lus:/lus", word]
    directory = _render(hpc_env, data, "weaviate")
    script = directory / "ranks" / "rank-001.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    subprocess.run(["bash", str(script)], check=True, cwd=hpc_env, timeout=30)
    assert not marker.exists()
    argv = (directory / "ranks" / "001.argv").read_text().splitlines()
    assert word in argv  # one literal word
    # the run-time placeholders still expand: the env file and the rank directory are found
    assert f"{directory}/ranks/001/run/server.env" in argv


def test_plan_shows_hostile_apptainer_args_single_quoted(hpc_env: Path) -> None:  # noqa: F811
    marker = hpc_env / "MARKER"
    data = study("polaris")
    data["vdb"]["cluster"]["apptainer_args"] = [f"$(touch {marker})"]
    result = run_cli("plan", str(write(hpc_env, data)))
    assert result.returncode == 0, result.stderr
    assert f"'$(touch {marker})'" in result.stdout
    assert not marker.exists()


@pytest.mark.parametrize(("database", "rank"), [("milvus", 1), ("weaviate", 0)])
@pytest.mark.parametrize("hostile", [*HOSTILE_WORDS[:3], "a\\", 'b"c'])
def test_database_env_values_are_literal_in_env_files(
    hpc_env: Path,  # noqa: F811
    database: str,
    rank: int,
    hostile: str,
) -> None:
    """Apptainer reads --env-file with a shell interpreter; bash stands in for it here."""
    marker = hpc_env / "MARKER"
    value = hostile.replace(M, str(marker))
    data = study("polaris")
    index = [d["name"] for d in data["vdb"]["databases"]].index(database)
    data["vdb"]["databases"][index]["env"] = {"USER_VALUE": value}
    directory = _render(hpc_env, data, database)
    env_file = directory / "ranks" / f"{rank:03d}" / "server.env"
    read = subprocess.run(
        ["bash", "-c", 'set -a; . "$1"; printf %s "$USER_VALUE"', "-", str(env_file)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert read.stdout == value
    assert not marker.exists()


def test_placeholders_expand_and_everything_else_is_literal(tmp_path: Path) -> None:
    """``${VDB_...}`` run-time values expand in the rank scripts; any other '$' stays as written."""
    marker = tmp_path / "MARKER"
    text = f"${{VDB_RANK_DIR}}/run:$(touch {marker})$HOME${{VDB_ADDR}}"
    out = subprocess.run(
        ["bash", "-c", f"VDB_RANK_DIR=/r VDB_ADDR=10.0.0.1; printf %s {_dq(text)}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == f"/r/run:$(touch {marker})$HOME10.0.0.1"
    assert not marker.exists()
