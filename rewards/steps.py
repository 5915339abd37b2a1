"""Step checks for process supervision: is each written equation right, and grounded?

A reasoning step is an equation `a op b = c` (or `a op b gives c`). It counts as correct when the
arithmetic holds and both operands are grounded: each is a number from the question or a result
stated by an earlier step. This catches the two ways a small model goes wrong on multi-step
arithmetic, a wrong fact (`10 - 2 = 7`) and an operand that came from nowhere (`7 - 4` when the
question subtracts 5), without any gold solution path, so it works on any problem whose
reasoning is written as equations. The checker is a rule, not a learned reward model.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from problems.scripts import to_latin

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_EQUATION = re.compile(
    r"(?<![\d.])(-?\d+(?:\.\d+)?)\s*([-+*×x/])\s*(-?\d+(?:\.\d+)?)\s*(?:=|gives)\s*(-?\d+(?:\.\d+)?)"
)
_OPS: dict[str, Callable[[float, float], float | None]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "×": lambda a, b: a * b,
    "x": lambda a, b: a * b,
    "/": lambda a, b: a / b if b else None,
}


@dataclass(frozen=True)
class StepCheck:
    end: int  # offset in the completion just past the step's result
    operands: tuple[float, float]
    right: bool  # the arithmetic holds
    grounded: bool  # both operands are numbers of the question or results of earlier steps

    @property
    def correct(self) -> bool:
        return self.right and self.grounded


def check_steps(question: str, completion: str) -> list[StepCheck]:
    """Every equation in `completion`, in order, with whether it is right and grounded."""
    known = {float(m) for m in _NUMBER.findall(question)}
    checks = []
    for match in _EQUATION.finditer(completion):
        a, op, b, c = float(match[1]), match[2], float(match[3]), float(match[4])
        value = _OPS[op](a, b)
        right = value is not None and abs(value - c) < 1e-9
        checks.append(
            StepCheck(match.end(), (a, b), right=right, grounded=a in known and b in known)
        )
        known.add(c)
    return checks


_VERDICT = re.compile(r"(?<![\d.])(-?\d+) vs (-?\d+): (yes|no)\b")


def check_verdicts(completion: str, target: str) -> list[StepCheck]:
    """The logic family's checks (`16 vs 23: no`) as steps, in either script: right when the
    verdict is, and grounded when it compares the last result with the target."""
    latin = to_latin(completion)
    results = [(m.end(), float(m[4])) for m in _EQUATION.finditer(latin)]
    checks = []
    for match in _VERDICT.finditer(latin):
        a, b, said = float(match[1]), float(match[2]), match[3] == "yes"
        before = [value for end, value in results if end <= match.start()]
        grounded = bool(before) and a == before[-1] and str(int(b)) == target.strip()
        checks.append(StepCheck(match.end(), (a, b), right=said == (a == b), grounded=grounded))
    return checks


def process_steps(question: str, completion: str, family: str, target: str) -> list[StepCheck]:
    """The steps process supervision rewards, in order: a math completion's equations; a logic
    completion's equations and its checks of each attempt against the target. A code
    completion has none: its check of a program's brackets is no arithmetic to verify."""
    if family == "math":
        return check_steps(question, completion)
    if family == "logic":
        steps = check_steps(question, to_latin(completion)) + check_verdicts(completion, target)
        return sorted(steps, key=lambda s: s.end)
    return []
