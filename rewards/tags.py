"""Tag credit: half for a think block, half for an answer block after it.

Softer than the all-or-nothing format reward, so a policy that gets some of the structure right
still sees a gradient toward the rest (the open-r1 recipe's tag count serves the same end). A
block is credited only when its tags appear once each, in order, around visible text: tags
alone, reversed or repeated earn nothing.
"""

from __future__ import annotations

from contracts.answer_format import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN, block


def tag_count(completion: str) -> float:
    think = block(completion, THINK_OPEN, THINK_CLOSE) is not None
    answer = block(completion, ANSWER_OPEN, ANSWER_CLOSE) is not None
    if think and answer and completion.index(ANSWER_OPEN) < completion.index(THINK_CLOSE):
        answer = False  # an answer block inside or before the reasoning is not the format's
    return 0.5 * think + 0.5 * answer


def tag_count_reward(prompts: list[str], completions: list[str], **_: object) -> list[float | None]:
    return [tag_count(c) for c in completions]
