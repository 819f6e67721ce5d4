"""A finished (or partly finished) run as its ``provenance.json`` describes it, found by id or directory.

``report`` and ``compare`` read runs through :func:`find_run`: ``<run>`` is a run directory
(``<workdir>/runs/<run id>``) or a run id looked up under ``<workdir>/runs/``. Nothing here starts a
database or a Parsl executor: it reads provenance, manifests and result files.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.errors import ArtifactError, PipelineError
from pipeline.config.model import RunConfig
from pipeline.provenance import PROVENANCE
from pipeline.sweep import POINTS_DIR, slug


class RunNotFound(PipelineError):
    """``<run>`` names no run directory and no run id under the workdir."""

    exit_code = 2


@dataclass(frozen=True)
class StageRef:
    """One stage of a run: its content key and output directory, as the provenance recorded them."""

    name: str
    key: str
    directory: Path


@dataclass(frozen=True)
class PointRef:
    """One sweep point a run's report rests on: where its outcome (manifest.json / skipped.json) is."""

    label: str
    repeat: int
    key: str
    link: str  # its name under the vdb stage directory (telemetry figures are named by it)
    directory: Path
    status: str = "succeeded"  # succeeded | skipped


@dataclass
class RunRecord:
    """A run read back: its id, directory, provenance and stages.

    It carries what :func:`pipeline.report_stage.write_benchmark_report` reads of a plan (``config``,
    ``stages``, ``stage()``, ``points``), so the report can be rewritten from it without the plan: the
    corpus or model the run read need not be there any more.
    """

    run_dir: Path
    provenance: dict[str, Any]
    stages: dict[str, StageRef]
    points: list[PointRef] = field(default_factory=list)
    _config: RunConfig | None = None

    @property
    def run_id(self) -> str:
        return str(self.provenance.get("run_id") or self.run_dir.name)

    @property
    def config_dict(self) -> dict[str, Any]:
        """The run's resolved configuration as recorded (plain data)."""
        return dict(self.provenance.get("config") or {})

    @property
    def config(self) -> RunConfig:
        """The run's configuration, validated (a configuration this version no longer reads: an error)."""
        if self._config is None:
            try:
                self._config = RunConfig.model_validate(self.config_dict)
            except ValidationError as exc:
                commit = (self.provenance.get("pipeline") or {}).get("commit")
                raise ArtifactError(
                    f"run {self.run_id}: its recorded configuration no longer validates with this version "
                    f"of the pipeline ({exc.error_count()} error(s), first: {_first_error(exc)}); re-render "
                    f"it with the version that made it (commit {commit or 'unknown'})"
                ) from None
        return self._config

    def stage(self, name: str) -> StageRef:
        return self.stages[name]

    @property
    def vdb(self) -> StageRef:
        """The vdb stage; a run without one is an error naming the run."""
        if "vdb" not in self.stages:
            raise ArtifactError(
                f"run {self.run_id} ({self.run_dir}) has no vdb stage: its configuration has no `vdb` "
                "section or it stopped before the databases (nothing to report or compare)"
            )
        return self.stages["vdb"]

    @property
    def report_dir(self) -> Path:
        """``<vdb stage dir>/report``: results.parquet, report.md and the figures."""
        return self.vdb.directory / "report"


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    return f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"


def default_workdir() -> Path:
    """Where run ids are looked up: ``$PIPELINE_WORKDIR`` (as configs/local.yaml uses it), else ``.``."""
    return Path(os.environ.get("PIPELINE_WORKDIR") or ".").expanduser()


def run_directory(run: str, workdir: Path | None = None) -> Path:
    """The directory of ``run``: a run directory itself, or ``<workdir>/runs/<run>``."""
    given = Path(run).expanduser()
    if (given / PROVENANCE).is_file():
        return given
    runs = (workdir or default_workdir()) / "runs"
    candidate = runs / run
    if (candidate / PROVENANCE).is_file():
        return candidate
    if given.is_dir():
        raise RunNotFound(f"{given} is not a run directory (it has no {PROVENANCE})")
    known = sorted(p.name for p in runs.glob("*") if (p / PROVENANCE).is_file()) if runs.is_dir() else []
    hint = f"; runs there: {', '.join(known[-5:])}" if known else f"; {runs} holds no run"
    raise RunNotFound(f"no run {run!r}: not a run directory and not a run id under {runs}{hint}")


def find_run(run: str, workdir: Path | None = None) -> RunRecord:
    """Read the run ``run`` (id or directory); RunNotFound / ArtifactError name what is wrong."""
    run_dir = run_directory(run, workdir)
    path = run_dir / PROVENANCE
    try:
        provenance = json.loads(path.read_text(encoding="utf-8"))
        stages = {
            name: StageRef(name, str(stage["key"]), Path(stage["directory"]))
            for name, stage in provenance["stages"].items()
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"{path}: not a readable provenance file ({exc!r})") from None
    record = RunRecord(run_dir, provenance, stages)
    vdb = provenance["stages"].get("vdb")
    if vdb is not None:
        record.points = _points(vdb, stages["vdb"].directory)
    return record


def _points(vdb: dict[str, Any], directory: Path) -> list[PointRef]:
    """The points of the run's report: as the run recorded them, else the stage manifest's, else the links
    in the stage directory (runs made before points were recorded)."""
    if vdb.get("points"):
        return [
            PointRef(p["label"], int(p["repeat"]), p["key"], p["link"], Path(p["directory"]), p["status"])
            for p in vdb["points"]
        ]
    store = directory.parent.parent  # <store>/vdb/<key>
    points = []
    manifest_path = directory / "manifest.json"
    if manifest_path.is_file():
        try:
            listed = json.loads(manifest_path.read_text(encoding="utf-8")).get("points") or []
        except ValueError as exc:
            raise ArtifactError(f"{manifest_path}: not readable JSON ({exc})") from None
        links = {p.resolve(): p.name for p in directory.iterdir() if p.is_symlink()}
        for p in listed:
            where = store / POINTS_DIR / p["key"]
            link = links.get(where, slug(p["label"]))
            points.append(PointRef(p["label"], int(p["repeat"]), p["key"], link, where))
        return points
    if directory.is_dir():  # partly finished, before points were recorded: the points linked so far
        for link in sorted(directory.iterdir()):
            target = link.resolve()
            done = (target / "manifest.json").is_file()
            if link.is_symlink() and target.parent.name == POINTS_DIR and done:
                points.append(PointRef(link.name, 0, target.name, link.name, target))
    return points
