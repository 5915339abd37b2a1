"""Settings whose sizes no machine can hold, refused before anything runs.

A stage holds some things whole in the process's memory: an evaluation's completions (every
held-out problem times `n_samples`, each up to `max_new_tokens`), a GRPO step's or an on-policy
step's samples, a rejection chunk's, and a training stage's order of prompts for all its steps,
drawn up front. A number mistyped by orders of magnitude (`evaluation.n_samples=100000000000`,
`reasoning_rl.steps=1e12`) is a valid integer: the run took it, went through the cached stages
and then grew one list until the kernel's out-of-memory killer ended it, or another process on
the machine. Here each such size is estimated from the settings alone and refused, naming the
settings, when it exceeds the machine's whole memory; a real run is far below that.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from configs.schema import PipelineConfig

# A sampled token as a completion holds it: its id and log-probability as Python objects in
# lists (8-byte pointers to a 28-byte int and a 24-byte float) and its share of the text.
TOKEN_BYTES = 72
# One entry of a stage's order of prompts: a pointer and a Python int.
ORDER_ENTRY_BYTES = 36


class PlanSizeError(ValueError):
    """A setting (or a product of settings) asks a stage to hold more than the machine has."""


@dataclass(frozen=True)
class Held:
    """Something a stage holds whole, its size estimated from the settings that set it."""

    what: str  # the settings, with their values
    bytes: int


def held_at_once(config: PipelineConfig) -> list[Held]:
    """What each section's stages hold whole, by the settings that size it."""
    held = [_evaluation(config)] if _heldout(config) is not None else []
    for key, stage in config.grpo_stages().items():
        per_step = stage.prompts_per_step + (stage.general_prompts or 0)
        held += [
            Held(
                f"{key}.steps {stage.steps} x prompts_per_step {per_step}: its prompt order",
                stage.steps * per_step * ORDER_ENTRY_BYTES,
            ),
            Held(
                f"{key}: prompts_per_step {per_step} x group_size {stage.group_size} x "
                f"max_new_tokens {stage.max_new_tokens}: a step's samples",
                per_step * stage.group_size * stage.max_new_tokens * TOKEN_BYTES,
            ),
        ]
    for key, rejection in (
        ("rejection", config.rejection),
        ("distillation.traces", config.distillation.traces),
    ):
        held.append(
            Held(
                f"{key}: chunk_prompts {rejection.chunk_prompts} x samples_per_prompt "
                f"{rejection.samples_per_prompt} x max_new_tokens {rejection.max_new_tokens}: "
                "a chunk's samples",
                rejection.chunk_prompts
                * rejection.samples_per_prompt
                * rejection.max_new_tokens
                * TOKEN_BYTES,
            )
        )
    on_policy = config.distillation.on_policy
    if config.distillation.method == "on_policy":
        held += [
            Held(
                f"distillation.on_policy.steps {on_policy.steps} x prompts_per_step "
                f"{on_policy.prompts_per_step}: its prompt order",
                on_policy.steps * on_policy.prompts_per_step * ORDER_ENTRY_BYTES,
            ),
            Held(
                f"distillation.on_policy: prompts_per_step {on_policy.prompts_per_step} x "
                f"samples_per_prompt {on_policy.samples_per_prompt} x max_new_tokens "
                f"{on_policy.max_new_tokens}: a step's samples",
                on_policy.prompts_per_step
                * on_policy.samples_per_prompt
                * on_policy.max_new_tokens
                * TOKEN_BYTES,
            ),
        ]
    return held


def _heldout(config: PipelineConfig) -> int | None:
    """How many held-out problems an evaluation samples: `max_problems`, else the tiny world's
    held-out problems; None for a data file's, whose rows are not counted here."""
    cap = config.evaluation.max_problems
    if config.data.source != "tiny":
        return cap
    world = config.data.world
    count = sum(f.n_heldout for f in (world.math, world.code, world.logic) if f is not None)
    return min(count, cap) if cap is not None else count


def _evaluation(config: PipelineConfig) -> Held:
    evaluation, problems = config.evaluation, _heldout(config) or 0
    return Held(
        f"evaluation: {problems} held-out problems x n_samples {evaluation.n_samples} x "
        f"max_new_tokens {evaluation.max_new_tokens}: its completions",
        problems * evaluation.n_samples * evaluation.max_new_tokens * TOKEN_BYTES,
    )


def check_plan_sizes(config: PipelineConfig, memory: int | None = None) -> None:
    """Raise PlanSizeError naming each size a stage would hold that exceeds `memory` (bytes;
    by default the machine's whole memory)."""
    total = memory if memory is not None else psutil.virtual_memory().total
    over = [h for h in held_at_once(config) if h.bytes > total]
    if over:
        lines = [
            f"profile {config.name}: {len(over)} setting(s) ask a stage to hold more than this "
            f"machine's {_gib(total)} of memory:"
        ]
        lines += [f"  {h.what}: about {_gib(h.bytes)}" for h in over]
        raise PlanSizeError("\n".join(lines))


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB" if size < 2**50 else f"{size / 2**30:.2e} GiB"
