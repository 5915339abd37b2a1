"""A data set's own worked solutions as text: the reasoning a person wrote, and the answer.

GSM8K's calculator annotations (`48/2 = <<48/2=24>>24`) are tool-use markup, not reasoning, and
go; its `#### 72` line is the answer. A MATH solution states its answer in `\\boxed{}` and keeps
it. Curation makes cold-start traces of these (curation.reference_traces); the bootstrap, for real
data from scratch, makes its corpus and tokenizer texts of them (problems.corpus).
"""

from __future__ import annotations

import re

from contracts.answer_format import formatted
from problems.types import Problem

_CALCULATOR = re.compile(r"<<[^<>]*>>")


def reasoning_text(solution: str) -> str:
    """The worked reasoning of a solution: calculator annotations and the `####` line gone."""
    text = _CALCULATOR.sub("", solution)
    if "####" in text:
        text = text[: text.rfind("####")]
    return text.strip()


def summary(problem: Problem) -> str:
    """The answer block's text: the final answer, boxed when the solution boxes it (MATH)."""
    if "\\boxed{" in problem.solution:
        return f"The answer is $\\boxed{{{problem.answer}}}$."
    return f"The answer is {problem.answer}."


def solution_trace(problem: Problem) -> str | None:
    """`<think> reasoning </think> <answer> summary </answer>`; None without a solution."""
    reasoning = reasoning_text(problem.solution)
    if not reasoning:
        return None
    return formatted(reasoning, summary(problem))


def traceable(problem: Problem) -> bool:
    """Whether the programmatic teacher can write this problem's traces: a tiny-world problem
    with worked steps (math, logic) or operations (code); a real data set's problem has none."""
    return bool(problem.steps)
