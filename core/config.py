"""The base of every configuration model (unknown keys are an error, assignments are validated), and the
error a cross-field check raises to point at the field it is about."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Base for every config section: unknown keys are an error, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class FieldError(ValueError):
    """A model validator's problem with one field below the model (``loc``): the loader reports it at that
    field's line, not at the model's (a root check would otherwise read ``<top level>``)."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
