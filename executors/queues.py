"""Queue limits read live from the scheduler: ``qstat -Qf`` (PBS Pro) and ``scontrol show partition`` (Slurm).

A config's ``executor.queues`` table is a copy of the site's documentation, which drifts (ALCF retired
Aurora's ``tiny`` and ``prod-large`` in 2026). Where the scheduler's own command is on PATH and answers
within a few seconds, ``validate`` and ``plan`` check the run against what it says instead; elsewhere
(a laptop, CI) they use the table. :func:`resolve` picks the source; :func:`use_queue_limits` makes a
choice apply to every check made inside it (the CLI wraps validate/plan in it), and :func:`current`
returns the table a check should use.

The parsers take the commands' text, so tests feed recorded output (``tests/executors/fixtures/``).
"""

from __future__ import annotations

import contextlib
import getpass
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from core.errors import ConfigError
from executors.config import QueueLimits, QueueRoute

Mode = Literal["auto", "live", "table"]
MODES: tuple[str, ...] = ("auto", "live", "table")
TIMEOUT_S = 5.0  # a login node's scheduler answers in well under a second; a hung one must not stall plan
PBS_PLATFORMS = ("polaris", "aurora")
# Walltime fields hold at most 999 hours (executors.config.Walltime): longer limits are no limit in practice.
_MAX_HOURS = 999


# --- PBS Pro: qstat -Qf ----------------------------------------------------------------------------------


@dataclass
class PbsQueue:
    """The attributes of one queue in ``qstat -Qf`` output that limit a job (None: not set)."""

    name: str
    queue_type: str = "Execution"
    min_nodes: int | None = None
    max_nodes: int | None = None
    min_walltime: str | None = None
    max_walltime: str | None = None
    route_destinations: list[str] = field(default_factory=list)
    max_run_per_user: int | None = None
    max_queued_per_user: int | None = None
    max_run_nodes_per_user: int | None = None
    enabled: bool = True
    started: bool = True
    attributes: dict[str, str] = field(default_factory=dict)

    @property
    def is_route(self) -> bool:
        """A routing queue: jobs submitted here are moved to one of ``route_destinations``."""
        return self.queue_type.lower().startswith("route")


def _qf_records(text: str) -> Iterator[tuple[str, dict[str, str]]]:
    """(queue name, attribute -> value) of each ``Queue:`` record.

    qstat wraps a long value onto continuation lines indented by a tab (8 columns when the tab was
    expanded), cutting anywhere, even inside a word: continuations are joined without a separator.
    Attribute lines are indented by 4 spaces. Lines starting with '#' are a recorded file's comments.
    """
    name: str | None = None
    attrs: dict[str, str] = {}
    last: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip("\n")
        if not line.strip() or line.lstrip().startswith("#"):
            last = None if not line.strip() else last
            continue
        if line.startswith("Queue:"):
            if name is not None:
                yield name, attrs
            name, attrs, last = line.split(":", 1)[1].strip(), {}, None
            continue
        if name is None:
            continue
        continuation = line.startswith("\t") or (len(line) - len(line.lstrip(" ")) >= 8)
        if continuation and last is not None:
            attrs[last] += line.strip()
            continue
        key, sep, value = line.strip().partition(" = ")
        if sep:
            last = key.strip()
            attrs[last] = value.strip()
    if name is not None:
        yield name, attrs


def _entity_limit(value: str | None, user: str | None) -> int | None:
    """The per-user cell of a PBS limit table such as ``[u:PBS_GENERIC=4],[u:alice=9]`` or
    ``[u:alice=9,u:PBS_GENERIC=4]``: the user's own cell when there is one, else ``u:PBS_GENERIC``.

    Cells for groups (g:), projects (p:) and the whole queue (o:PBS_ALL) are not per-user limits.
    """
    if not value:
        return None
    cells = dict(re.findall(r"u:([^=\[\],\s]+)=(\d+)", value))
    chosen = cells.get(user or "") or cells.get("PBS_GENERIC")
    return int(chosen) if chosen is not None else None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() else None


def _hms(value: str | None) -> str | None:
    """A PBS duration ([[HH:]MM:]SS, or seconds) as HH:MM:SS; None when absent or beyond 999 h."""
    if not value:
        return None
    value = value.strip()
    if not re.fullmatch(r"\d+(:\d+){0,2}", value):
        return None
    parts = [int(p) for p in value.split(":")]
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + part
    return _seconds_to_hms(seconds)


def _seconds_to_hms(seconds: int) -> str | None:
    hours, rest = divmod(seconds, 3600)
    if hours > _MAX_HOURS:
        return None
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


def _true(value: str | None) -> bool:
    return value is None or value.strip().lower() == "true"


def parse_qstat_qf(text: str, user: str | None = None) -> dict[str, PbsQueue]:
    """Every queue in ``qstat -Qf`` output, by name.

    Node limits come from ``resources_min/max.nodect`` (else ``.nodes`` when it is a number), walltime
    limits from ``resources_min/max.walltime``; per-user limits from ``max_run``, ``max_queued`` and
    ``max_run_res.nodect`` (the cell of ``user``, else ``u:PBS_GENERIC``), or the old ``max_user_run``
    and ``max_user_queuable``. ``user`` defaults to the login name.
    """
    user = user if user is not None else _login()
    queues: dict[str, PbsQueue] = {}
    for name, attrs in _qf_records(text):
        destinations = attrs.get("route_destinations", "")
        queues[name] = PbsQueue(
            name=name,
            queue_type=attrs.get("queue_type", "Execution"),
            min_nodes=_int(attrs.get("resources_min.nodect")) or _int(attrs.get("resources_min.nodes")),
            max_nodes=_int(attrs.get("resources_max.nodect")) or _int(attrs.get("resources_max.nodes")),
            min_walltime=_hms(attrs.get("resources_min.walltime")),
            max_walltime=_hms(attrs.get("resources_max.walltime")),
            # a destination may name a server too (queue@server): the queue is what the limits are keyed by
            route_destinations=[d.strip().split("@")[0] for d in destinations.split(",") if d.strip()],
            max_run_per_user=_entity_limit(attrs.get("max_run"), user) or _int(attrs.get("max_user_run")),
            max_queued_per_user=(
                _entity_limit(attrs.get("max_queued"), user) or _int(attrs.get("max_user_queuable"))
            ),
            max_run_nodes_per_user=_entity_limit(attrs.get("max_run_res.nodect"), user),
            enabled=_true(attrs.get("enabled")),
            started=_true(attrs.get("started")),
            attributes=attrs,
        )
    return queues


def _per_user(queue: PbsQueue) -> dict[str, Any]:
    return {
        "max_running_per_user": queue.max_run_per_user,
        "max_queued_per_user": queue.max_queued_per_user,
        "max_running_nodes_per_user": queue.max_run_nodes_per_user,
    }


def pbs_limits(queues: dict[str, PbsQueue]) -> tuple[dict[str, QueueLimits], dict[str, str]]:
    """(queue -> limits, queue -> why it takes no jobs) from parsed ``qstat -Qf`` output.

    A routing queue's limits are its own; each destination that is an execution queue with a node
    range becomes one of its routes, in the order PBS tries them (the first that accepts a job takes it).
    A queue that is not enabled refuses qsub, one not started runs nothing: both are set apart.
    """
    limits: dict[str, QueueLimits] = {}
    closed: dict[str, str] = {}
    for name, q in queues.items():
        if not q.enabled or not q.started:
            closed[name] = "enabled = False" if not q.enabled else "started = False"
            continue
        routes = []
        for dest in q.route_destinations if q.is_route else []:
            d = queues.get(dest)
            if d is None or d.is_route or d.max_nodes is None or not d.max_walltime:
                continue  # a destination whose size range is unknown cannot be matched to a job
            routes.append(
                QueueRoute(
                    queue=dest,
                    min_nodes=d.min_nodes or 1,
                    max_nodes=d.max_nodes,
                    max_walltime=d.max_walltime,
                    **_per_user(d),
                )
            )
        limits[name] = QueueLimits(
            min_nodes=q.min_nodes or 1,
            max_nodes=q.max_nodes,
            min_walltime=q.min_walltime,
            max_walltime=q.max_walltime,
            routes=routes,
            **_per_user(q),
        )
    return limits, closed


# --- Slurm: scontrol show partition (and sacctmgr show qos) ------------------------------------------------


@dataclass
class SlurmPartition:
    """The fields of one ``scontrol show partition`` record that limit a job."""

    name: str
    min_nodes: int = 1
    max_nodes: int | None = None
    max_walltime: str | None = None
    state: str = "UP"
    qos: str | None = None
    fields: dict[str, str] = field(default_factory=dict)


def slurm_duration(value: str) -> str | None:
    """A Slurm time limit (``UNLIMITED``, ``INFINITE``, ``d-hh:mm:ss``, ``d-hh``, ``hh:mm:ss``, ``mm:ss``,
    ``mm``) as HH:MM:SS; None for no limit."""
    value = value.strip()
    if value.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days, _, clock = value.rpartition("-") if "-" in value else ("0", "", value)
    parts = [int(p) for p in clock.split(":")]
    if "-" in value:  # d-hh, d-hh:mm, d-hh:mm:ss
        hours, minutes, seconds = [*parts, 0, 0][:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:
        hours, minutes, seconds = 0, parts[0], 0
    return _seconds_to_hms(((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds)


def parse_scontrol_partitions(text: str) -> dict[str, SlurmPartition]:
    """Every partition in ``scontrol show partition`` output (multi-line or ``--oneliner``), by name.

    ``MaxNodes=UNLIMITED`` is capped by ``TotalNodes``: Slurm refuses a job larger than its partition.
    """
    partitions: dict[str, SlurmPartition] = {}
    fields: dict[str, str] = {}

    def close() -> None:
        if "PartitionName" not in fields:
            return
        total = _int(fields.get("TotalNodes"))
        most = _int(fields.get("MaxNodes"))
        qos = fields.get("QoS")
        partitions[fields["PartitionName"]] = SlurmPartition(
            name=fields["PartitionName"],
            min_nodes=max(1, _int(fields.get("MinNodes")) or 1),
            max_nodes=min(n for n in (most, total) if n is not None) if (most or total) else None,
            max_walltime=slurm_duration(fields.get("MaxTime", "UNLIMITED")),
            state=fields.get("State", "UP"),
            qos=qos if qos and qos != "N/A" else None,
            fields=dict(fields),
        )

    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for token in line.split():
            key, sep, value = token.partition("=")
            if not sep:
                continue
            if key == "PartitionName":
                close()
                fields = {}
            fields[key] = value
    close()
    return partitions


def parse_sacctmgr_qos(text: str) -> dict[str, tuple[int | None, int | None]]:
    """QOS name -> (MaxJobsPU, MaxSubmitPU) from ``sacctmgr -nP show qos format=name,maxjobspu,maxsubmitpu``
    (a header line, when present, is skipped)."""
    found: dict[str, tuple[int | None, int | None]] = {}
    for line in text.splitlines():
        cells = line.strip().split("|")
        if len(cells) < 3 or cells[0] in ("", "Name") or line.lstrip().startswith("#"):
            continue
        found[cells[0]] = (_int(cells[1]), _int(cells[2]))
    return found


def slurm_limits(
    partitions: dict[str, SlurmPartition], qos: dict[str, tuple[int | None, int | None]] | None = None
) -> tuple[dict[str, QueueLimits], dict[str, str]]:
    """(partition -> limits, partition -> why it takes no jobs); a partition's QoS gives per-user limits."""
    limits: dict[str, QueueLimits] = {}
    closed: dict[str, str] = {}
    for name, p in partitions.items():
        if p.state.upper() != "UP":
            closed[name] = f"State={p.state}"
            continue
        running, queued = (qos or {}).get(p.qos or "", (None, None))
        limits[name] = QueueLimits(
            min_nodes=p.min_nodes,
            max_nodes=p.max_nodes,
            max_walltime=p.max_walltime,
            max_running_per_user=running,
            max_queued_per_user=queued,
        )
    return limits, closed


# --- which table a check uses ------------------------------------------------------------------------------


@dataclass
class QueueTable:
    """The queue limits a check uses, and where they came from (for the plan's output)."""

    limits: dict[str, QueueLimits]
    source: str  # e.g. "live from qstat -Qf on polaris-login-01"
    live: bool
    command: str | None = None  # "qstat -Qf" / "scontrol show partition"; None for the config's table
    closed: dict[str, str] = field(default_factory=dict)  # queue -> why it takes no jobs (live only)

    def missing(self, queue: str) -> str:
        """Why ``queue`` is not in the table, naming the table."""
        known = ", ".join(sorted(self.limits)) or "none"
        if queue in self.closed:
            return f"queue {queue!r} takes no jobs ({self.command}: {self.closed[queue]})"
        if self.live:
            return f"queue {queue!r} is not among the queues {self.command} lists ({known})"
        return f"queue {queue!r} is not in executor.queues ({known})"


class QueueLimitsUnavailable(Exception):
    """The scheduler's command cannot be used here; the message says why (e.g. 'qstat not found')."""


def command_for(platform: str) -> list[str]:
    """The command whose output lists the queues of ``platform``'s scheduler."""
    if platform in PBS_PLATFORMS:
        return ["qstat", "-Qf"]
    if platform == "slurm":
        return ["scontrol", "show", "partition"]
    raise ValueError(f"platform {platform!r} has no batch scheduler")


def _login() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry, no LOGNAME: only generic limits apply
        return None


Runner = Callable[..., subprocess.CompletedProcess]


def _run(argv: list[str], timeout_s: float, runner: Runner) -> str:
    name = " ".join(argv)
    if shutil.which(argv[0]) is None and runner is subprocess.run:
        raise QueueLimitsUnavailable(f"{argv[0]} not found")
    try:
        done = runner(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise QueueLimitsUnavailable(f"{name} did not answer in {timeout_s:g} s") from None
    except OSError as exc:
        raise QueueLimitsUnavailable(f"{name} could not run: {exc.strerror or exc}") from None
    if done.returncode != 0:
        first = (done.stderr or done.stdout or "").strip().splitlines()[:1]
        raise QueueLimitsUnavailable(f"{name} failed (exit {done.returncode}: {' '.join(first)})")
    return done.stdout


def read_live(
    platform: str,
    *,
    recorded: Path | None = None,
    timeout_s: float = TIMEOUT_S,
    qos: list[str] | None = None,
    runner: Runner = subprocess.run,
) -> QueueTable:
    """The queue limits the scheduler reports now (or in ``recorded``, a saved copy of its output).

    ``qos`` (Slurm): QOS names whose per-user limits ``sacctmgr`` is asked for; without accounting
    (no slurmdbd) the partitions' limits alone are used. Raises :class:`QueueLimitsUnavailable`.
    """
    argv = command_for(platform)
    command = " ".join(argv)
    if recorded is not None:
        try:
            text = Path(recorded).read_text(encoding="utf-8")
        except OSError as exc:
            raise QueueLimitsUnavailable(f"cannot read {recorded}: {exc.strerror or exc}") from None
        where = f"recorded in {recorded}"
    else:
        text = _run(argv, timeout_s, runner)
        where = f"on {socket.gethostname()}"
    if platform in PBS_PLATFORMS:
        limits, closed = pbs_limits(parse_qstat_qf(text))
    else:
        partitions = parse_scontrol_partitions(text)
        names = sorted({*(qos or []), *(p.qos for p in partitions.values() if p.qos)})
        table: dict[str, tuple[int | None, int | None]] = {}
        if names and recorded is None:
            query = ["sacctmgr", "-nP", "show", "qos", ",".join(names), "format=name,maxjobspu,maxsubmitpu"]
            with contextlib.suppress(QueueLimitsUnavailable):  # accounting is optional on a Slurm site
                table = parse_sacctmgr_qos(_run(query, timeout_s, runner))
        limits, closed = slurm_limits(partitions, table)
    if not limits and not closed:
        raise QueueLimitsUnavailable(f"{command} {where} lists no queues")
    return QueueTable(limits, f"live from {command} {where}", live=True, command=command, closed=closed)


def table_of(executor: Any, why: str = "") -> QueueTable:
    """The config's own table (``executor.queues``), described with its date and ``why`` it is used."""
    as_of = getattr(executor, "queues_as_of", None)
    source = f"the config's table of {as_of}" if as_of else "the config's table (undated)"
    if not getattr(executor, "queues", None):
        source = "none checked: the config has no executor.queues table"
    return QueueTable(
        dict(getattr(executor, "queues", {})), f"{source}{f' ({why})' if why else ''}", live=False
    )


def resolve(
    executor: Any,
    mode: Mode = "auto",
    *,
    recorded: Path | None = None,
    timeout_s: float = TIMEOUT_S,
    runner: Runner = subprocess.run,
) -> QueueTable:
    """The queue limits for ``executor``: ``live`` (the scheduler's, or ``recorded`` output; a ConfigError
    when unavailable), ``table`` (the config's) or ``auto`` (live when the command answers, else the table).
    """
    return _pick(executor, mode, lambda: _read(executor, recorded, timeout_s, runner))


def _read(executor: Any, recorded: Path | None, timeout_s: float, runner: Runner) -> QueueTable | str:
    """The live table, or why there is none."""
    qos = [executor.qos] if getattr(executor, "qos", None) else None
    try:
        return read_live(executor.platform, recorded=recorded, timeout_s=timeout_s, qos=qos, runner=runner)
    except QueueLimitsUnavailable as exc:
        return str(exc)


def check_mode(mode: str, given: str = "--queue-limits") -> None:
    """ConfigError unless ``mode`` is one of :data:`MODES`; ``given``: how the user gave it, for the message
    (the option, or the variable that sets it)."""
    if mode not in MODES:
        raise ConfigError(f"{given} must be one of {', '.join(MODES)}, not {mode!r}")


def _pick(executor: Any, mode: str, live: Callable[[], QueueTable | str]) -> QueueTable:
    check_mode(mode)
    if mode == "table":
        return table_of(executor, "--queue-limits table")
    found = live()
    if isinstance(found, QueueTable):
        return found
    if mode == "live":
        raise ConfigError(f"queue limits cannot be read live: {found}")
    return table_of(executor, found)


@dataclass
class _Choice:
    mode: Mode
    recorded: Path | None
    timeout_s: float
    reads: dict[str, QueueTable | str] = field(default_factory=dict)  # platform -> live table or why not
    used: dict[str, QueueTable] = field(default_factory=dict)  # platform -> the table last used


_CHOICE: ContextVar[_Choice | None] = ContextVar("queue_limits_choice", default=None)


@contextlib.contextmanager
def use_queue_limits(
    mode: Mode = "auto", recorded: Path | None = None, timeout_s: float = TIMEOUT_S
) -> Iterator[_Choice]:
    """Inside this block, :func:`current` resolves queue limits with ``mode`` (the scheduler is asked
    once per platform). Outside any such block checks use the config's table: a library call or a test
    never runs qstat. The yielded object's ``used`` maps each platform checked to the table it used.
    """
    check_mode(mode)
    if recorded is not None and mode == "table":
        raise ConfigError("a recorded queue listing needs --queue-limits live or auto, not table")
    choice = _Choice(mode, recorded, timeout_s)
    token = _CHOICE.set(choice)
    try:
        yield choice
    finally:
        _CHOICE.reset(token)


def current(executor: Any) -> QueueTable:
    """The queue table a check of ``executor`` uses now (see :func:`use_queue_limits`)."""
    choice = _CHOICE.get()
    if choice is None:
        return table_of(executor)

    def live() -> QueueTable | str:
        if executor.platform not in choice.reads:
            choice.reads[executor.platform] = _read(
                executor, choice.recorded, choice.timeout_s, subprocess.run
            )
        return choice.reads[executor.platform]

    table = _pick(executor, choice.mode, live)
    choice.used[executor.platform] = table
    return table


def used_tables() -> dict[str, QueueTable]:
    """Platform -> the queue table checks used inside the current :func:`use_queue_limits` block."""
    choice = _CHOICE.get()
    return dict(choice.used) if choice else {}
