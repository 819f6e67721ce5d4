"""Ranks without Apptainer (``vdb.cluster.runtime: native``): servers run from the nodes' file system.

A database's ``ranks`` module plans its ranks once, for a container: fixed paths inside the image bound to
host directories. Running natively only changes where those paths are, so a bind mount becomes a path
rename: every container path of a bind is replaced by its host path in the command, the environment and
the config files, and the image's entry point by the configured executable. The local Slurm testbed runs
this way (docs/slurm-local.md), as does a site without Apptainer.
"""

from __future__ import annotations

from pathlib import Path

from apps.vdb.base import DatabaseError
from apps.vdb.cluster.spec import RankSpec


def run_dir(directory: Path, rank: int) -> str:
    """The directory a rank renders its config files into (``${VDB_RANK_DIR}/run`` of the rank script)."""
    return str(directory / "ranks" / f"{rank:03d}" / "run")


def native_spec(spec: RankSpec, executable: str, directory: Path) -> RankSpec:
    """``spec`` with its binds turned into host paths and its entry point into ``executable``."""
    rank_run = run_dir(directory, spec.rank)
    renames = sorted(
        ((target, host.replace("${VDB_RANK_DIR}", rank_run)) for host, target in spec.binds),
        key=lambda pair: -len(pair[0]),  # the longest container path first: /a/b before /a
    )

    def host_path(text: str) -> str:
        for target, host in renames:
            if text == target or text.startswith(target + "/"):
                return host + text[len(target) :]
            text = text.replace(f"={target}", f"={host}").replace(f"{target}/", f"{host}/")
        return text

    argv = [executable, *(host_path(a) for a in spec.argv[1:])]
    flags = list(spec.apptainer_flags)
    cwd = flags[flags.index("--pwd") + 1] if "--pwd" in flags else None
    if cwd is not None and host_path(cwd) == cwd:
        raise DatabaseError(
            f"{spec.role} rank {spec.rank}: working directory {cwd} exists only inside the image; "
            "runtime native cannot run this rank"
        )
    spec.argv = argv
    spec.env = {k: host_path(v) for k, v in spec.env.items()}
    spec.files = {name: _rename_in_text(text, renames) for name, text in spec.files.items()}
    spec.binds = []
    spec.apptainer_flags = []
    spec.workdir = host_path(cwd) if cwd else None
    return spec


def _rename_in_text(text: str, renames: list[tuple[str, str]]) -> str:
    """Container paths in a config file, as whole path prefixes, replaced by host paths."""
    for target, host in renames:
        text = text.replace(f"{target}/", f"{host}/").replace(f": {target}\n", f": {host}\n")
    return text
