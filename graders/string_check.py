"""string_check: 1 or 0 from comparing the rendered input with the rendered reference.

eq: equal; ne: not equal; like: the input contains the reference; ilike: the same, ignoring
case. Strings are compared exactly as rendered (no trimming), as the hosted grader does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from graders.base import Item, Outcome, Sample, per_sample
from graders.spec import StringCheckSpec
from graders.templates import render

OPERATIONS: dict[str, Callable[[str, str], bool]] = {
    "eq": lambda text, ref: text == ref,
    "ne": lambda text, ref: text != ref,
    "like": lambda text, ref: ref in text,
    "ilike": lambda text, ref: ref.casefold() in text.casefold(),
}


def string_check(operation: str, text: str, reference: str) -> float:
    return 1.0 if OPERATIONS[operation](text, reference) else 0.0


@dataclass(frozen=True)
class StringCheckGrader:
    spec: StringCheckSpec
    pass_threshold: float | None = None  # the hosted schema has none: a check passes at 1

    @property
    def name(self) -> str:
        return self.spec.name

    def grade(self, sample: Sample, item: Item) -> float:
        text = render(self.spec.input, sample, item)
        return string_check(self.spec.operation, text, render(self.spec.reference, sample, item))

    def evaluate(self, samples: Sequence[Sample], items: Sequence[Item]) -> list[Outcome]:
        return per_sample(self.grade, samples, items)
