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

__all__ = ["FAMILY_REWARDS", "grade_all", "grade_code", "grade_logic"]


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
    items: Sequence[tuple[str, Gradable]], strict: bool = True, runner: CodeReward | None = None
) -> list[Grade]:
    """Grades of (completion, problem) pairs of the code family, judged in one sandbox session;
    a program is right when it passes every test, None when the sandbox could not judge it.
    The same program for the same tests is run once."""
    runner = runner or CodeReward()
    programs = [extract_code(c, strict) for c, _ in items]
    unique: dict[tuple[str, tuple[str, ...]], int] = {}
    for program, (_, problem) in zip(programs, items, strict=True):
        if program is not None:
            unique.setdefault((program, tuple(problem.tests)), len(unique))
    keys = list(unique)
    fenced = [f"<answer>\n```python\n{program}```\n</answer>" for program, _ in keys]
    scores = runner([""] * len(keys), fenced, [list(tests) for _, tests in keys]) if keys else []
    grades = []
    for program, (_, problem) in zip(programs, items, strict=True):
        if program is None:
            grades.append(Grade(None, False))
            continue
        score = scores[unique[(program, tuple(problem.tests))]]
        grades.append(Grade(program, None if score is None else score >= 1.0))
    return grades


def grade_all(
    problems: Sequence[Gradable],
    completions: Sequence[str],
    strict: bool = True,
    runner: CodeReward | None = None,
) -> list[Grade]:
    """The grade of each completion by its problem's family verifier, in order."""
    grades: list[Grade | None] = [None] * len(completions)
    code = [i for i, p in enumerate(problems) if p.family == "code"]
    for i, got in zip(
        code, grade_code([(completions[i], problems[i]) for i in code], strict, runner), strict=True
    ):
        grades[i] = got
    for i, (problem, completion) in enumerate(zip(problems, completions, strict=True)):
        if problem.family == "logic":
            grades[i] = grade_logic(completion, problem, strict)
        elif problem.family != "code":
            grades[i] = grade(completion, problem.answer, strict)
    return [g for g in grades if g is not None]
