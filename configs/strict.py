"""What every config shares: strict, frozen models (an unknown key is refused, a typo must not
fall back to a default, and the object MLflow logs is the object that ran)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class HowItRuns:
    """Marks a setting that says how a stage runs, never what it computes
    (`log_every: Annotated[int, HOW_IT_RUNS]`): how often it logs, saves a checkpoint or shows
    samples; how long its calls and processes may take and where they meet; how it lays its
    work out in memory (micro-batches, chunks, buckets, activations recomputed, kernels
    compiled), which changes its numbers no more than the order of floating-point sums does. A
    stage's key and its checkpoints' fingerprint leave these out (`computed_settings`), so
    changing one, as an error may advise (a timeout raised, a smaller micro-batch after running
    out of memory), neither computes a finished stage again nor starts an unfinished one again
    from its first step: it resumes from its checkpoint."""

    def __repr__(self) -> str:
        return "HOW_IT_RUNS"


HOW_IT_RUNS = HowItRuns()


def computed_settings(config: BaseModel) -> dict[str, Any]:
    """`config` as JSON without the settings that say only how a stage runs, at any depth: what
    decides what it computes."""
    return config.model_dump(mode="json", exclude=_how_it_runs(config) or None)


def _how_it_runs(config: BaseModel) -> dict[Any, Any]:
    """The `exclude` argument of `model_dump` that leaves out every `HOW_IT_RUNS` setting."""
    found: dict[Any, Any] = {}
    for name, info in type(config).model_fields.items():
        value = getattr(config, name)
        if any(isinstance(mark, HowItRuns) for mark in info.metadata):
            found[name] = True
        elif isinstance(value, BaseModel):
            found[name] = _how_it_runs(value)
        elif isinstance(value, list | tuple):
            items = enumerate(value)
            found[name] = {i: _how_it_runs(v) for i, v in items if isinstance(v, BaseModel)}
        if found.get(name) == {}:
            del found[name]
    return found


Family = Literal["math", "code", "logic"]


def hub_id_field() -> Any:
    """The `hub_id` field of a checkpoint: where a user with hub access downloads `path`."""
    return Field(
        None,
        description="the hub repository `path` is a download of (e.g. Qwen/Qwen2.5-1.5B-Instruct):"
        " named in messages and records, never fetched",
    )
