"""Each family's verifier, and the grade of a completion by its problem's family.

One definition of "correct" serves the training rewards, curation, the rejection funnel and
evaluation: math by its answer (rewards/accuracy.py), code by every hidden test passing in the
sandbox (rewards/code.py), logic by the stated expression reaching the target
(rewards/countdown.py). Strict grades read only the answer block; lenient ones also read a
completion without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from problems.types import FAMILY_REWARDS
from rewards.accuracy import Grade, grade
from rewards.code import CodeReward, extract_code
from rewards.countdown import reaches, stated_expression

__all__ = [
    "FAMILY_REWARDS",
    "grade_all",
    "grade_code",
    "grade_logic",
    "grade_readings",
]


class Gradable(Protocol):
    """What grading needs of a problem (problems.types.Problem has it)."""

    answer: str
    family: str
    tests: tuple[str, ...]
    numbers: tuple[int, ...]


def grade_logic(completion: str, problem: Gradable, strict: bool = True) -> Grade:
    expression = stated_expression(completion, strict)
    return Grade(expression, reaches(expression, problem.numbers, problem.answer))


def grade_code(
    items: Sequence[tuple[str, Gradable]],
    readings: Sequence[bool],
    runner: CodeReward | None = None,
) -> list[list[Grade]]:
    """Grades of (completion, problem) pairs of the code family under each reading of `readings`
    (strict or lenient): a program is right when it passes every test, None when the sandbox
    could not judge it. The programs of every reading are judged in one sandbox session, the
    same program for the same tests once (a strict and a lenient reading mostly find the same)."""
    runner = runner or CodeReward()
    programs = [[extract_code(c, strict) for c, _ in items] for strict in readings]
    unique: dict[tuple[str, tuple[str, ...]], int] = {}
    for found in programs:
        for program, (_, problem) in zip(found, items, strict=True):
            if program is not None:
                unique.setdefault((program, tuple(problem.tests)), len(unique))
    keys = list(unique)
    fenced = [f"<answer>\n```python\n{program}```\n</answer>" for program, _ in keys]
    scores = runner([""] * len(keys), fenced, [list(tests) for _, tests in keys]) if keys else []

    def graded(program: str | None, problem: Gradable) -> Grade:
        if program is None:
            return Grade(None, False)
        score = scores[unique[(program, tuple(problem.tests))]]
        return Grade(program, None if score is None else score >= 1.0)

    return [
        [graded(program, problem) for program, (_, problem) in zip(found, items, strict=True)]
        for found in programs
    ]


def grade_all(
    problems: Sequence[Gradable],
    completions: Sequence[str],
    strict: bool = True,
    runner: CodeReward | None = None,
) -> list[Grade]:
    """The grade of each completion by its problem's family verifier, in order."""
    return grade_readings(problems, completions, (strict,), runner)[0]


def grade_readings(
    problems: Sequence[Gradable],
    completions: Sequence[str],
    readings: Sequence[bool] = (True, False),
    runner: CodeReward | None = None,
) -> list[list[Grade]]:
    """`grade_all`'s grades under each reading of `readings` (strict, then lenient by default),
    the code family's programs of every reading judged in one sandbox session."""
    code = [i for i, p in enumerate(problems) if p.family == "code"]
    judged = grade_code([(completions[i], problems[i]) for i in code], readings, runner)
    out = []
    for strict, code_grades in zip(readings, judged, strict=True):
        of_code = dict(zip(code, code_grades, strict=True))
        out.append(
            [
                of_code[i]
                if problem.family == "code"
                else grade_logic(completion, problem, strict)
                if problem.family == "logic"
                else grade(completion, problem.answer, strict)
                for i, (problem, completion) in enumerate(zip(problems, completions, strict=True))
            ]
        )
    return out
