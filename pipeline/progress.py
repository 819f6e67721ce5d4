"""What a run says on its console: progress for long stages (shards done/total, items per second, ETA;
rich) and the one form of a warning line."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from core.format import duration


def warn(console: Console, message: str) -> None:
    """Print ``warning: message`` on ``console`` and go on; the message is text (a point's ``[label]`` or a
    path is not rich markup) and one line however narrow the terminal."""
    console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


class StageProgress(AbstractContextManager):
    """One bar per stage, advanced from Parsl future callbacks (thread-safe through rich)."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description:<12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[items]:>14} {task.fields[rate]:>9}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
            console=console,
            transient=False,
        )
        # Without a terminal (CI logs, nohup, a batch job) live bars are invisible: print a line per task.
        self.plain = not console.is_terminal
        self.console = console
        self._tasks: dict[str, TaskID] = {}
        self._items: dict[str, int] = {}
        self._reused: dict[str, int] = {}
        self._started: dict[str, float] = {}
        self._expected: dict[str, float] = {}  # a stage's tasks' expected seconds, where they differ
        self._expected_done: dict[str, float] = {}

    def __enter__(self) -> StageProgress:
        if not self.plain:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if not self.plain:
            self.progress.stop()

    def add_stage(self, name: str, total: int, expected_s: float | None = None) -> None:
        """Show a stage with ``total`` tasks (shards). ``expected_s``: the tasks' expected seconds in all,
        where they differ (database points: minutes against hours); each :meth:`advance` gives its own."""
        self._items[name] = 0
        self._reused[name] = 0
        self._started[name] = time.monotonic()
        if expected_s:
            self._expected[name], self._expected_done[name] = expected_s, 0.0
        self._tasks[name] = self.progress.add_task(name, total=total, items="", rate="", eta="")

    def inputs_ready(self, name: str) -> None:
        """The inputs ``name``'s tasks waited for are there: its rate counts from now, not from when it
        was queued behind them."""
        self._started[name] = time.monotonic()

    def phase(self, name: str, text: str) -> None:
        """What ``name``'s task in progress is doing now (a database point's deploy, insert, index, query):
        beside the bar, or a line of its own without a terminal."""
        if self.plain:
            self.console.print(f"{name}: {text}", highlight=False, markup=False)
        else:
            self.progress.update(self._tasks[name], description=f"{name} {escape(text)}")

    def advance(
        self,
        name: str,
        items: int = 0,
        *,
        reused: bool = False,
        expected_s: float = 0.0,
        dropped_s: float = 0.0,
    ) -> None:
        """One task of ``name`` finished, having processed ``items`` items (chunks, vectors, queries); a
        stage whose tasks are its only count (the database points) passes none and shows no item rate.
        ``expected_s``: this task's share of the stage's ``expected_s``; ``dropped_s`` instead, for a task
        that ended without its work (a point that failed in seconds): taken off the stage's total, not
        counted as done, else the pace of the rest would look that fast.

        A task ``reused`` from an earlier run leaves the bar (its total shrinks) and is counted apart:
        counted as done, it would make the rate and the ETA of the work left look fast.
        """
        if reused:
            self._reused[name] += 1
            if name in self._expected:
                self._expected[name] -= expected_s
            task = self.progress.tasks[self._tasks[name]]
            self.progress.update(self._tasks[name], total=(task.total or 1) - 1)
            return
        self._items[name] += items
        if name in self._expected:
            self._expected_done[name] += expected_s
            self._expected[name] -= dropped_s
        count = self._items[name]
        elapsed = max(time.monotonic() - self._started[name], 1e-6)
        shown = f"{count:,} items" if count else ""
        rate = f"{count / elapsed:,.1f}/s" if count else ""
        self.progress.update(self._tasks[name], advance=1, items=shown, rate=rate, description=name)
        task = self.progress.tasks[self._tasks[name]]
        left = self._seconds_left(name, (task.total or 0) - task.completed, task.completed, elapsed)
        eta = f"ETA {duration(left)}" if left else ""
        self.progress.update(self._tasks[name], eta=eta)
        if self.plain:
            eta = f", {eta}" if eta else ""
            done = f"{task.completed:.0f}/{task.total:.0f}"
            before = f" ({self._reused[name]} done before)" if self._reused[name] else ""
            line = f"{name}: {done} done{before}" + (f", {shown} {rate}" if count else "") + eta
            self.console.print(line, highlight=False)

    def _seconds_left(self, name: str, tasks_left: float, tasks_done: float, elapsed: float) -> float | None:
        """The time ``name``'s work left takes at the pace of its work done so far: by expected seconds
        where the stage gave them (a point expected to take an hour is not the mean of the fast ones),
        else by tasks. A mean since the stage's start, not rich's 30 s window: a stage whose tasks take
        minutes would lose its ETA between them."""
        if tasks_left <= 0 or tasks_done <= 0:
            return None
        expected, done = self._expected.get(name), self._expected_done.get(name, 0.0)
        if expected is not None and done > 0:
            return max(expected - done, 0.0) * elapsed / done
        return tasks_left * elapsed / tasks_done
