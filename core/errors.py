"""Errors the user must see, each with the exit code the CLI returns for it."""

from __future__ import annotations


class PipelineError(Exception):
    """Base class: a failure explained in one message; the CLI prints it without a traceback."""

    exit_code = 1


class ConfigError(PipelineError):
    """The configuration is wrong: names the file, line, field path and bad value."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None) -> None:
        where = file or "<config>"
        if line is not None:
            where += f":{line}"
        super().__init__(f"{where}: {message}")
        self.file = file
        self.line = line


class InputDataError(PipelineError):
    """The corpus, term list or model input is wrong: names the file and line/record."""

    exit_code = 3


class ArtifactError(PipelineError):
    """An existing artifact conflicts with what this run would write, or fails verification."""

    exit_code = 4
