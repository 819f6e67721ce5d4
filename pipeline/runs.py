"""A finished (or partly finished) run as its ``provenance.json`` describes it, found by id or directory.

``status``, ``report`` and ``compare`` read runs through :func:`find_run`: ``<run>`` is a run directory
(``<workdir>/runs/<run id>``) or a run id looked up under ``<workdir>/runs/``. Nothing here starts a
database or a Parsl executor: it reads provenance, manifests and result files.

The shape of what is read (provenance, the vdb stage's manifest, a point's outcome) is checked here, once:
a damaged file is an :class:`~core.errors.ArtifactError` naming the file and its first bad field, never a
``KeyError`` further on.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from core.errors import ArtifactError, PipelineError
from core.watchdog import is_alive
from pipeline.config.model import RunConfig
from pipeline.provenance import PROVENANCE
from pipeline.sweep import POINTS_DIR, slug

if TYPE_CHECKING:
    from apps.vdb.records import DatabaseOutcome


class RunNotFound(PipelineError):
    """``<run>`` names no run directory and no run id under the workdir."""

    exit_code = 2


@dataclass(frozen=True)
class StageRef:
    """One stage of a run: its content key and output directory, as the provenance recorded them."""

    name: str
    key: str
    directory: Path
    cached: bool = False  # its output was complete before the run (reused)
    started: float | None = None
    finished: float | None = None  # None: still running, or stopped before it finished
    tasks: int = 0  # tasks finished
    rows: int = 0  # rows those tasks wrote


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
    provenance: ProvenanceRecord
    stages: dict[str, StageRef]
    points: list[PointRef] = field(default_factory=list)
    _config: RunConfig | None = None

    @property
    def run_id(self) -> str:
        return self.provenance.run_id or self.run_dir.name

    def lost(self) -> str | None:
        """Why a run recorded as running is not (its driver on this host is gone: killed, or the host
        restarted); None when it runs, ended, or runs on another host, where this cannot be told."""
        prov = self.provenance
        if prov.status != "running" or prov.host != socket.gethostname() or prov.driver is None:
            return None
        pid, started = prov.driver
        if is_alive(pid, started):
            return None
        return f"its driver (pid {pid}) is gone without finishing (killed, or the host restarted)"

    @property
    def config_dict(self) -> dict[str, Any]:
        """The run's resolved configuration as recorded (plain data)."""
        return dict(self.provenance.config or {})

    @property
    def config(self) -> RunConfig:
        """The run's configuration, validated (a configuration this version no longer reads: an error)."""
        if self._config is None:
            try:
                self._config = RunConfig.model_validate(self.config_dict)
            except ValidationError as exc:
                commit = (self.provenance.pipeline or {}).get("commit")
                raise ArtifactError(
                    f"run {self.run_id}: its recorded configuration no longer validates with this version "
                    f"of the pipeline ({exc.error_count()} error(s), first: {_first_error(exc)}); re-render "
                    f"it with the version that made it (commit {commit or 'unknown'})"
                ) from None
        return self._config

    def stage(self, name: str) -> StageRef:
        return self.stages[name]

    def outcome(self, point: PointRef) -> DatabaseOutcome:
        """The outcome ``point`` left (``manifest.json``, or ``skipped.json`` for a skipped optional one);
        a missing or damaged one is an ArtifactError naming the file (and its first bad field)."""
        from apps.vdb.records import DatabaseOutcome

        name = "skipped.json" if point.status == "skipped" else "manifest.json"
        path = point.directory / name
        try:
            return DatabaseOutcome.model_validate_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ArtifactError(
                f"run {self.run_id}: point {point.label} (repeat {point.repeat}) has no {name}: "
                f"{path} is missing"
            ) from None
        except OSError as exc:
            raise ArtifactError(f"run {self.run_id}: {path}: not readable ({exc.strerror or exc})") from None
        except ValidationError as exc:
            raise ArtifactError(
                f"run {self.run_id}: {path}: not a readable point outcome ({_summary(exc)})"
            ) from None

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
    """``field.path: message`` of the first of ``exc``'s errors (one line, no documentation links)."""
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in error["loc"])
    message = error["msg"]
    if error["type"] in ("model_type", "dict_type"):  # not "... instance of _StageRecord"
        message = f"expected a JSON object, got {_json_kind(error['input'])}"
    return f"{where}: {message}" if where else message


def _summary(exc: ValidationError) -> str:
    """The first error, and how many there are when more than one."""
    count = exc.error_count()
    return _first_error(exc) if count == 1 else f"{count} errors, first: {_first_error(exc)}"


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else type(value).__name__


# The shape of what the commands read of a run, as the pipeline writes it (pipeline/provenance.py,
# pipeline/vdb_stages.py). Fields a command can do without are optional; a present one has its type.
class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _PointRecord(_Record):
    label: str
    repeat: int
    key: str
    link: str
    directory: str
    status: Literal["succeeded", "skipped"]
    reused: bool = False  # done by an earlier run


class _TaskRecord(_Record):
    rows: int | None = None


class _StageRecord(_Record):
    key: str
    directory: str
    cached: bool = False
    started: float | None = None
    finished: float | None = None
    tasks: list[_TaskRecord] = []
    points: list[_PointRecord] | None = None  # the vdb stage's, once a point finished
    planned_points: int | None = None  # how many points the vdb stage was to measure


class ProvenanceRecord(_Record):
    """A run's ``provenance.json`` as the commands read it (pipeline/provenance.py writes it)."""

    run_id: str | None = None
    status: str | None = None
    error: str | None = None
    started: float | None = None
    host: str | None = None
    driver: tuple[int, float | None] | None = None  # (pid, start: core.watchdog.create_time)
    config: dict[str, Any] | None = None
    pipeline: dict[str, Any] | None = None
    stages: dict[str, _StageRecord]


class _ManifestPoint(_Record):
    label: str
    repeat: int
    key: str


class _StageManifest(_Record):
    points: list[_ManifestPoint] | None = None


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
    for directory in (given, candidate):
        if directory.is_dir():
            raise RunNotFound(f"{directory} is not a run directory (it has no {PROVENANCE})")
    known = sorted(p.name for p in runs.glob("*") if (p / PROVENANCE).is_file()) if runs.is_dir() else []
    hint = f"; runs there: {', '.join(known[-5:])}" if known else f"; {runs} holds no run"
    raise RunNotFound(f"no run {run!r}: not a run directory and not a run id under {runs}{hint}")


def find_run(run: str, workdir: Path | None = None) -> RunRecord:
    """Read the run ``run`` (id or directory); RunNotFound / ArtifactError name what is wrong."""
    run_dir = run_directory(run, workdir)
    path = run_dir / PROVENANCE
    provenance = _read_json(path, "provenance file")
    try:
        recorded = ProvenanceRecord.model_validate(provenance)
    except ValidationError as exc:
        raise ArtifactError(f"{path}: not a valid provenance file ({_summary(exc)})") from None
    stages = {
        name: StageRef(
            name,
            stage.key,
            Path(stage.directory),
            stage.cached,
            stage.started,
            stage.finished,
            len(stage.tasks),
            sum(t.rows or 0 for t in stage.tasks),
        )
        for name, stage in recorded.stages.items()
    }
    record = RunRecord(run_dir, recorded, stages)
    vdb = recorded.stages.get("vdb")
    if vdb is not None:
        try:
            record.points = _points(vdb, stages["vdb"].directory)
        except OSError as exc:  # a stage directory or manifest that cannot be read
            raise ArtifactError(f"run {record.run_id}: {exc}") from None
    return record


def _read_json(path: Path, what: str) -> Any:
    """``path``'s JSON; a missing, unreadable or malformed file is an ArtifactError naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ArtifactError(f"{path}: not a readable {what} ({exc.strerror or exc})") from None
    except ValueError as exc:  # also a UnicodeDecodeError
        raise ArtifactError(f"{path}: not a readable {what}: not JSON ({exc})") from None


def _points(vdb: _StageRecord, directory: Path) -> list[PointRef]:
    """The points of the run's report: as the run recorded them, else the stage manifest's, else the links
    in the stage directory (runs made before points were recorded)."""
    if vdb.points:
        return [PointRef(p.label, p.repeat, p.key, p.link, Path(p.directory), p.status) for p in vdb.points]
    store = directory.parent.parent  # <store>/vdb/<key>
    points = []
    manifest_path = directory / "manifest.json"
    if manifest_path.is_file():
        try:
            manifest = _StageManifest.model_validate(_read_json(manifest_path, "stage manifest"))
        except ValidationError as exc:
            raise ArtifactError(f"{manifest_path}: not a valid stage manifest ({_summary(exc)})") from None
        links = {p.resolve(): p.name for p in directory.iterdir() if p.is_symlink()}
        for p in manifest.points or []:
            where = store / POINTS_DIR / p.key
            link = links.get(where, slug(p.label))
            points.append(PointRef(p.label, p.repeat, p.key, link, where))
        return points
    if directory.is_dir():  # partly finished, before points were recorded: the points linked so far
        for link in sorted(directory.iterdir()):
            target = link.resolve()
            done = (target / "manifest.json").is_file()
            if link.is_symlink() and target.parent.name == POINTS_DIR and done:
                points.append(PointRef(link.name, 0, target.name, link.name, target))
    return points
