"""text_similarity: the chosen metric of the rendered input against the rendered reference.

The score is the metric itself (in [0, 1]); pass_threshold only says which scores pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graders.base import Item, Outcome, Sample, per_sample
from graders.similarity import METRICS
from graders.spec import TextSimilaritySpec
from graders.templates import render


@dataclass(frozen=True)
class TextSimilarityGrader:
    spec: TextSimilaritySpec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pass_threshold(self) -> float | None:
        return self.spec.pass_threshold

    def grade(self, sample: Sample, item: Item) -> float:
        metric = METRICS[self.spec.evaluation_metric]
        return metric(
            render(self.spec.input, sample, item), render(self.spec.reference, sample, item)
        )

    def evaluate(self, samples: Sequence[Sample], items: Sequence[Item]) -> list[Outcome]:
        return per_sample(self.grade, samples, items)
