"""What every grader shares: the sample and item it grades, and the outcome it gives."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from contracts.answer_format import answer_block
from graders.templates import SampleTemplateError

Sample = dict[str, Any]
Item = Mapping[str, Any]


@dataclass(frozen=True)
class Outcome:
    """One sample's score, or None with the reason it could not be graded."""

    score: float | None
    error: str | None = None


class Grader(Protocol):
    """A loaded grader: scores a batch of samples, each against its dataset item."""

    name: str
    pass_threshold: float | None

    def evaluate(self, samples: Sequence[Sample], items: Sequence[Item]) -> list[Outcome]: ...


def make_sample(completion: str) -> Sample:
    """The `sample` namespace for one completion.

    `output_text` is the whole completion; `output_json` the completion parsed as JSON (None when
    it is not JSON); `answer_text` the text of its one `<answer>` block, stripped, or "" when it
    has none or more than one: an answer counts only where the format puts it (a grader that
    wants the whole text reads `output_text`).
    """
    block = answer_block(completion)
    return {
        "output_text": completion,
        "output_json": _as_json(completion),
        "answer_text": block if block is not None else "",
    }


def _as_json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def per_sample(
    grade_one: Callable[[Sample, Item], float], samples: Sequence[Sample], items: Sequence[Item]
) -> list[Outcome]:
    """Apply a one-sample grading function; any failure scores that sample None."""
    outcomes = []
    for sample, item in zip(samples, items, strict=True):
        try:
            outcomes.append(Outcome(float(grade_one(sample, item))))
        except SampleTemplateError as exc:  # the completion lacks what the grader reads: fails
            outcomes.append(Outcome(0.0, f"{type(exc).__name__}: {exc}"))
        except Exception as exc:  # a malformed sample or item must not stop the batch
            outcomes.append(Outcome(None, f"{type(exc).__name__}: {exc}"))
    return outcomes


def passed(grader: Grader, score: float | None) -> bool | None:
    """Whether a score reaches the grader's pass_threshold (None: no score or no threshold)."""
    if score is None or grader.pass_threshold is None:
        return None
    return score >= grader.pass_threshold
