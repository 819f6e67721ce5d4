"""Errors the user must see, each with the exit code the CLI returns for it.

Every error here crosses process boundaries (Parsl tasks, client process pools) by pickle: it is rebuilt
from its message and attributes without calling ``__init__`` (whose signature differs per class), and
:func:`portable` turns any other exception into one that survives the trip.
"""

from __future__ import annotations

import pickle
from typing import Any


def _rebuild(cls: type[PipelineError], args: tuple, state: dict[str, Any]) -> PipelineError:
    """Unpickle a PipelineError as it was: same args (message) and attributes, ``__init__`` not rerun."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class PipelineError(Exception):
    """Base class: a failure explained in one message; the CLI prints it without a traceback."""

    exit_code = 1

    # Parsl's workers install tblib's pickling for every exception class (parsl.app.python), which
    # pickles __context__ too: the client-library error an error was raised over, ``from None``, often
    # cannot be unpickled. Such a suppressed context reads as None.
    @property  # type: ignore[override]
    def __context__(self) -> BaseException | None:
        return None if self.__suppress_context__ else BaseException.__context__.__get__(self)

    @__context__.setter
    def __context__(self, value: BaseException | None) -> None:
        BaseException.__context__.__set__(self, value)

    def __reduce__(self) -> tuple:
        # The default reduce calls cls(*args): wrong for subclasses whose __init__ takes other arguments
        # (ConfigError would prefix its location twice). The cause chain is never pickled.
        return _rebuild, (type(self), self.args, dict(self.__dict__))


class ConfigError(PipelineError):
    """The configuration is wrong: names the file, line, field path and bad value."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None) -> None:
        # No file: a command-line option, whose message names it (``--queue-limits must be ...``).
        where = (file or "") + (f":{line}" if file and line is not None else "")
        super().__init__(f"{where}: {message}" if where else message)
        self.file = file
        self.line = line


class InputDataError(PipelineError):
    """The corpus, term list or model input is wrong: names the file and line/record."""

    exit_code = 3


class ArtifactError(PipelineError):
    """An existing artifact conflicts with what this run would write, or fails verification."""

    exit_code = 4


def os_message(exc: OSError) -> str:
    """``file: reason`` of an OSError, for a one-line message: without Python's ``[Errno N]`` prefix."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception (the type alone when it has no message)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def round_trips(exc: BaseException) -> bool:
    """Whether ``exc`` survives pickle.dumps + pickle.loads (what a process or Parsl boundary does)."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # any failure (missing constructor argument, recursion, unpicklable state)
        return False
    return True


def portable(exc: Exception, wrap: type[PipelineError] = PipelineError) -> Exception:
    """``exc`` ready to cross a process boundary, its message kept.

    A PipelineError is returned as it is, cut from its cause chain (Parsl pickles causes one by one, and a
    gRPC error that is its own cause recursed without end). Any other exception becomes ``wrap`` with
    ``Type: message``: client-library errors often cannot be rebuilt from their args.
    """
    if isinstance(exc, PipelineError) or (type(exc).__module__ == "builtins" and round_trips(exc)):
        # Cut from both chains: Parsl installs tblib's pickling for every exception class, which pickles
        # __context__ as well as __cause__.
        exc.__cause__ = exc.__context__ = None
        exc.__suppress_context__ = True
        return exc
    return wrap(describe(exc))
