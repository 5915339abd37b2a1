"""multi: sub-graders by name, combined per sample by the `calculate_output` formula.

Only the sub-graders the formula names are run. A sample scores None when any of them could not
score it, or when the formula cannot be evaluated for it (log of 0, division by 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graders.base import Grader, Item, Outcome, Sample
from graders.formula import Formula, FormulaError, evaluate


@dataclass(frozen=True)
class MultiGrader:
    name: str
    graders: dict[str, Grader]
    formula: Formula
    pass_threshold: float | None = None  # the hosted schema has none

    def evaluate(self, samples: Sequence[Sample], items: Sequence[Item]) -> list[Outcome]:
        parts = {name: self.graders[name].evaluate(samples, items) for name in self.formula.names}
        return [self._combine({n: p[i] for n, p in parts.items()}) for i in range(len(samples))]

    def _combine(self, parts: dict[str, Outcome]) -> Outcome:
        missing = [f"{n} ({o.error})" for n, o in sorted(parts.items()) if o.score is None]
        if missing:
            return Outcome(None, "no score from " + ", ".join(missing))
        try:
            return Outcome(evaluate(self.formula, {n: o.score for n, o in parts.items()}))
        except FormulaError as exc:
            return Outcome(None, str(exc))
