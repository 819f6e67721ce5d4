"""The base of every configuration model: unknown keys are an error, assignments are validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Base for every config section: unknown keys are an error, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
