"""The points of the vector-database stage: each with its content key, directory and state.

A point (:class:`apps.vdb.sweep.SweepPoint`: a database entry x one value per swept field x a repeat) is
one deploy -> insert -> index -> query -> teardown chain. Its key hashes the point's concrete settings
(the database, collection, insert, query sweep, cluster shape and timeouts it runs with, and its repeat)
and the upstream keys (dataset, queries, ground truth); its label is not part of it, so renaming a point
reruns nothing. Its directory ``<store>/vdb-points/<key>`` does not depend on the rest of the sweep:
adding a point to a sweep reruns none of the others, and a finished point is never run again.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apps.vdb.config import VdbConfig
from apps.vdb.sweep import SweepPoint, label_slug
from core.errors import ArtifactError
from core.store import complete_manifest, content_key, read_manifest, verify_files

if TYPE_CHECKING:
    from apps.vdb.resources import PointEstimate

POINT_VERSION = "1"
POINTS_DIR = "vdb-points"


@dataclass(frozen=True)
class PointPlan:
    """One point of the plan: what it runs, its key and where its outputs go."""

    number: int  # position in run order, from 0
    point: SweepPoint
    key: str
    directory: Path
    link: str  # its name under the vdb stage directory (the label, plus the repeat when repeated)

    @property
    def label(self) -> str:
        return self.point.label

    @property
    def complete(self) -> bool:
        """True when a manifest of this point's key is there and verifies (a partial point is redone),
        as of its first read (see ``_verified``). A damaged manifest counts as absent: a point is always
        measured again from scratch."""
        return self._verified[0]

    def damage(self) -> list[str]:
        """Why a point finished before is no longer complete (see :func:`point_damage`)."""
        return self._verified[1]

    @cached_property
    def _verified(self) -> tuple[bool, list[str]]:
        """Whether complete, and any damage: read once per plan, as its raw files are hashed. The vdb
        stage reads a reused point's manifest again when it comes to it (hours may have passed)."""
        return point_state(self.directory, self.key)


def point_manifest(directory: Path) -> dict[str, Any] | None:
    """A finished point's manifest when every raw file it lists is whole, else None.

    Unlike a dataset's shards, a point's raw files are checked by their sha256, not their size only: a
    file damaged inside would be taken as measured and stop the report, and they are small (query ids and
    latencies: megabytes, where one point takes minutes to measure again)."""
    return complete_manifest(directory, checksums=True)


def point_state(directory: Path, key: str) -> tuple[bool, list[str]]:
    """Whether the point of ``key`` in ``directory`` is complete (as :func:`point_manifest` checks it),
    and, for one finished before, why it no longer is (its manifest or a raw file damaged or lost)."""
    try:
        manifest = read_manifest(directory)
    except ArtifactError as exc:
        return False, [str(exc).split("; delete it")[0]]
    if manifest is None or manifest.get("key") != key:
        return False, []
    problems = verify_files(directory, manifest.get("files", []), checksums=True)
    return not problems, problems


def point_damage(directory: Path, key: str) -> list[str]:
    """Why the point of ``key`` in ``directory``, finished before, is no longer complete; empty for one
    never finished, or complete."""
    return point_state(directory, key)[1]


# Per section of the vdb config: the open-loop rate field and the knobs that only matter when it is set.
OPEN_LOOP_KNOBS = {
    "query": ("rate", ("arrivals", "seed", "p99_bound_ms", "max_lag_ms")),
    "mixed": ("query_rate", ("arrivals", "seed", "max_lag_ms")),
}


def point_params(point: SweepPoint, metric: str) -> dict[str, Any]:
    """What a point's measurement depends on (its key's parameters): every concrete setting it runs with."""
    cfg = point.config
    params = cfg.model_dump(mode="json", exclude={"databases", "optional", "sweep", "repeats", "cluster"})
    # Open-loop knobs change nothing while their rate is off: left out, points measured before they
    # existed keep their keys (and are not run again).
    for section, (rate, knobs) in OPEN_LOOP_KNOBS.items():
        part = params.get(section)
        if part is not None and part.get(rate) is None:
            for knob in (rate, *knobs):
                part.pop(knob, None)
    params["database"] = point.settings.model_dump(mode="json")
    if cfg.cluster is not None:  # the deployment shape of this database (others' overrides do not matter)
        # Whether the ranks sample their servers is an observation, not a setting (as locally, where
        # telemetry is always on and in no key): switching it never reruns a finished point.
        params["cluster"] = cfg.cluster.for_database(point.database).model_dump(
            mode="json", exclude={"overrides", "telemetry"}
        )
    return {**params, "metric": metric, "repeat": point.repeat}


slug = label_slug  # a point's label as a file name (apps.vdb.sweep: unique per run)


def plan_points(vdb: VdbConfig, store: Path, upstream: list[str], metric: str) -> list[PointPlan]:
    """Every point of ``vdb`` in run order, keyed and placed (nothing is read but manifests)."""
    plans = []
    for number, point in enumerate(vdb.points):
        key = content_key("vdb-point", POINT_VERSION, point_params(point, metric), upstream)
        link = slug(point.label) if vdb.repeats == 1 else f"{slug(point.label)}.r{point.repeat}"
        plans.append(PointPlan(number, point, key, store / POINTS_DIR / key, link))
    return plans


def query_settings(point: SweepPoint) -> int:
    """Query settings a point measures, as its query stage sweeps them (an in-process engine with one
    client, no ef for an index without a search knob; ``rate: auto`` adds its steps at run time)."""
    from apps.vdb import runs_in_process
    from apps.vdb.stages.query_sweep import sweep

    config = point.config
    return len(sweep(config.query, config.collection.index_type, runs_in_process(point.settings)))


def query_cost(point: SweepPoint) -> tuple[int, float]:
    """A point's query settings and the seconds of measured windows they take at least (settings x
    ``duration_s``; none without it)."""
    settings = query_settings(point)
    return settings, settings * (point.config.query.duration_s or 0)


def load_s(point: SweepPoint, estimate: PointEstimate) -> float:
    """Seconds of upload (one per batch size) and index build the resource plan's ``estimate`` expects."""
    return estimate.upload_s * len(point.config.insert.batch_sizes) + (estimate.index_s or 0)


def expected_seconds(
    plans: list[PointPlan], estimates: dict[int, PointEstimate | None], local: bool
) -> list[float]:
    """Each point's expected seconds, as ``plan``'s sweep cost adds them: its measured query windows, the
    resource plan's upload and index time and, ``local``, its engine's start, warm-up and stop. A point
    neither timed nor estimated weighs the mean of the others (1 when none is): the progress ETA's weights."""
    from apps.vdb.resources import LOCAL_POINT_OVERHEAD_S

    found: list[float | None] = []
    for p in plans:
        estimate = estimates.get(id(p.point))
        work = query_cost(p.point)[1] + (load_s(p.point, estimate) if estimate is not None else 0.0)
        overhead = LOCAL_POINT_OVERHEAD_S.get(p.point.database, 0.0) if local else 0.0
        found.append(work + overhead if work else None)  # its start-up alone is no measure of a point
    known = [f for f in found if f is not None]
    mean = sum(known) / len(known) if known else 1.0
    return [mean if f is None else f for f in found]


def sweep_cost(
    vdb: VdbConfig,
    plans: list[PointPlan],
    estimates: dict[int, PointEstimate | None] | None = None,
    one_job: bool = False,
) -> str:
    """One line for ``plan``: points to run, pilot jobs, query settings, the floor of their measured
    windows and, with the resource plan's ``estimates`` (id of a point -> PointEstimate), the upload and
    index time it expects. A local sweep adds each engine's measured start, warm-up and stop per point
    and the total; on a cluster, the pilots' queue waits are not known. ``one_job``: the run is one
    allocation, its pilots are started inside it."""
    from apps.vdb import runs_in_process
    from apps.vdb.resources import LOCAL_POINT_OVERHEAD_S
    from core.format import duration

    todo = [p for p in plans if not p.complete]
    if not todo:
        return f"sweep cost: none: all {len(plans)} point(s) are done"
    jobs = sum(1 for p in todo if not runs_in_process(p.point.settings)) if vdb.cluster else 0
    pilots = "deployment(s) inside the one allocation" if one_job else "job(s)"
    costs = [query_cost(p.point) for p in todo]
    settings = sum(count for count, _ in costs)
    windows = sum(seconds for _, seconds in costs)
    floor = f"; at least {duration(windows)} of measured query windows" if windows else ""
    found = [(p.point, (estimates or {}).get(id(p.point))) for p in todo]
    loads = sum(load_s(point, e) for point, e in found if e is not None)
    expected = f"; about {duration(loads)} of upload and index by the resource plan" if loads else ""
    line = (
        f"sweep cost: {len(todo)} of {len(plans)} point(s) to run, {jobs} pilot {pilots}, {settings:,} query "
        f"setting(s){floor}{expected}"
    )
    if vdb.cluster is not None:
        if one_job:
            return line + " (the allocation's queue wait and the pilots' start-ups come on top)"
        return line + (" (the pilots' queue waits and start-ups come on top)" if jobs else "")
    known = sum(LOCAL_POINT_OVERHEAD_S.get(p.point.database, 0.0) for p in todo)
    line += f"; about {duration(known)} of start-ups, warm-ups and stops (each engine's, measured on 2 cores)"
    total = f": about {duration(windows + loads + known)} in all"
    besides = []
    if unmeasured := sorted({point.database for point, e in found if e is None}):
        count = sum(1 for _, e in found if e is None)
        besides.append(f"the upload and index of {count} point(s) of {', '.join(unmeasured)} (not estimated)")
    if untimed := sum(1 for p in todo if not p.point.config.query.duration_s):
        besides.append(f"the queries of {untimed} point(s) without query.duration_s")
    if mixed := sum(1 for p in todo if p.point.config.mixed is not None):
        besides.append(f"the mixed workload of {mixed} point(s)")
    return line + total + (f", besides {'; '.join(besides)}" if besides else "")


def describe(plans: list[PointPlan]) -> list[tuple[str, str, str, str, str, bool]]:
    """Rows for ``plan``: (number, label, repeat, swept parameters, key, done)."""
    from apps.vdb import runs_in_process
    from apps.vdb.stages.query_sweep import measured_clients

    rows = []
    for p in plans:
        params = ", ".join(f"{k}={v}" for k, v in p.point.params.items()) or "(no swept settings)"
        clients = p.point.config.query.clients
        if measured_clients(p.point.config.query, runs_in_process(p.point.settings)) != sorted(set(clients)):
            params += "\n       queries with 1 client (an in-process engine: "
            params += f"vdb.query.clients {clients} does not apply)"
        rows.append((str(p.number), p.label, str(p.point.repeat), params, p.key, p.complete))
    return rows
