"""What every config shares: strict, frozen models (an unknown key is refused, a typo must not
fall back to a default, and the object MLflow logs is the object that ran)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


Family = Literal["math", "code", "logic"]


def hub_id_field() -> Any:
    """The `hub_id` field of a checkpoint: where a user with hub access downloads `path`."""
    return Field(
        None,
        description="the hub repository `path` is a download of (e.g. Qwen/Qwen2.5-1.5B-Instruct):"
        " named in messages and records, never fetched",
    )
