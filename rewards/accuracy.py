"""Answer checking with math-verify, shared by evaluation, curation and the RL rewards.

The answer is read from the `<answer>` block when there is one, else from the whole completion;
GSM8K `#### 42` and MATH `\\boxed{42}` endings are honoured on both sides.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from functools import lru_cache

from math_verify import parse, verify

from problems.answers import final_answer_text
from rewards.format import answer_block

# math-verify enforces its timeouts with SIGALRM, which only the main thread may use; elsewhere
# (Prefect runs tasks in worker threads) the timeouts are off and it says so on every call.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_TIMEOUT_S = 5


def _timeout() -> int | None:
    return _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=65536)
def _parse(text: str) -> tuple:
    return tuple(parse(text, parsing_timeout=_timeout()))


@dataclass(frozen=True)
class Grade:
    """What a completion answered (`answer`, None when nothing parsed) and whether it is right.

    `correct` is None when the gold answer itself cannot be parsed: the sample cannot be verified.
    """

    answer: str | None
    correct: bool | None


def gold_is_verifiable(gold: str) -> bool:
    return bool(_parse(final_answer_text(gold)))


def grade(completion: str, gold: str) -> Grade:
    gold_parsed = _parse(final_answer_text(gold))
    block = answer_block(completion)
    pred_parsed = _parse(final_answer_text(block if block is not None else completion))
    answer = str(pred_parsed[-1]) if pred_parsed else None
    if not gold_parsed:
        return Grade(answer, None)
    if not pred_parsed:
        return Grade(None, False)
    return Grade(
        answer, bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=_timeout()))
    )


def accuracy_reward(
    prompts: list[str], completions: list[str], answer: list[str], **_: object
) -> list[float | None]:
    """1 for a correct final answer, 0 for a wrong or missing one, None if gold is unparseable."""
    rewards: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        correct = grade(completion, gold).correct
        rewards.append(None if correct is None else float(correct))
    return rewards
