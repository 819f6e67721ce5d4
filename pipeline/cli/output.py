"""The consoles the commands print to, and the one way a command ends on an error (no traceback)."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from core.errors import PipelineError
from pipeline import progress

# Soft wrap: a line is never broken by rich, only by the terminal showing it, so a path, a job script or a
# qsub line piped to a file or `less` (80 columns to rich) stays whole and can be copied.
console = Console(stderr=True, soft_wrap=True)  # messages, progress, errors
out = Console(soft_wrap=True)  # results a user may pipe


def error(message: str, code: int) -> NoReturn:
    """Print ``error: message`` and exit with ``code``."""
    # soft_wrap: one line however narrow the terminal (or a log file's 80 columns).
    # escape: a message quoting a point's label (``[medium=memory]``) or a path is text, not rich markup
    console.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def warn(message: str, to: Console | None = None) -> None:
    """Print ``warning: message`` (escaped, as ``error``) on ``to`` (default: :data:`console`) and go on."""
    progress.warn(to or console, message)


def fail(exc: PipelineError) -> NoReturn:
    """End the command with ``exc``'s message and exit code."""
    error(str(exc), exc.exit_code)
