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
    TimeRemainingColumn,
)


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
            TextColumn("ETA"),
            TimeRemainingColumn(),
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

    def __enter__(self) -> StageProgress:
        if not self.plain:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if not self.plain:
            self.progress.stop()

    def add_stage(self, name: str, total: int) -> None:
        """Show a stage with ``total`` tasks (shards)."""
        self._items[name] = 0
        self._reused[name] = 0
        self._started[name] = time.monotonic()
        self._tasks[name] = self.progress.add_task(name, total=total, items="", rate="")

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

    def advance(self, name: str, items: int = 0, *, reused: bool = False) -> None:
        """One task of ``name`` finished, having processed ``items`` items (chunks, vectors, queries); a
        stage whose tasks are its only count (the database points) passes none and shows no item rate.

        A task ``reused`` from an earlier run leaves the bar (its total shrinks) and is counted apart:
        counted as done, it would make the rate and the ETA of the work left look fast.
        """
        if reused:
            self._reused[name] += 1
            task = self.progress.tasks[self._tasks[name]]
            self.progress.update(self._tasks[name], total=(task.total or 1) - 1)
            return
        self._items[name] += items
        count = self._items[name]
        elapsed = max(time.monotonic() - self._started[name], 1e-6)
        shown = f"{count:,} items" if count else ""
        rate = f"{count / elapsed:,.1f}/s" if count else ""
        self.progress.update(self._tasks[name], advance=1, items=shown, rate=rate, description=name)
        if self.plain:
            task = self.progress.tasks[self._tasks[name]]
            eta = f", ETA {task.time_remaining:.0f}s" if task.time_remaining and not task.finished else ""
            done = f"{task.completed:.0f}/{task.total:.0f}"
            before = f" ({self._reused[name]} done before)" if self._reused[name] else ""
            line = f"{name}: {done} done{before}" + (f", {shown} {rate}" if count else "") + eta
            self.console.print(line, highlight=False)
