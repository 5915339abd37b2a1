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
