"""The tiny world's logic family: reach a target from given numbers with + - * /.

Each number is used once. Every puzzle has a solution that takes the numbers in the order given,
`(a op b) op c`, so a search over the operations finds it; which operations is the puzzle. A
first attempt is usually wrong and checking it against the target catches that, so trying,
checking and trying again pays (the teacher's traces do it, curation.teacher). The verifier is a
rule (rewards/countdown.py): it evaluates the stated expression exactly and checks the numbers.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

from configs.data import LogicWorld
from problems.scripts import to_script
from problems.types import Problem

OPS = ("+", "-", "*", "/")
Try = tuple[str, str]  # the two operations, in order: ("*", "+") for (a * b) + c


def apply_exact(left: int, op: str, right: int) -> int | None:
    """`left op right` when it stays a positive whole number, else None."""
    if op == "+":
        return left + right
    if op == "-":
        return left - right if left > right else None
    if op == "*":
        return left * right
    if op == "/":
        return left // right if right and left % right == 0 and left // right > 0 else None
    raise ValueError(f"unknown operation {op!r}")


def run_try(numbers: tuple[int, ...], ops: Try) -> tuple[int, int] | None:
    """(first result, final result) of `(a op1 b) op2 c`, None when a step leaves the whole
    positive numbers."""
    a, b, c = numbers
    first = apply_exact(a, ops[0], b)
    if first is None:
        return None
    final = apply_exact(first, ops[1], c)
    return None if final is None else (first, final)


def valid_tries(numbers: tuple[int, ...]) -> list[Try]:
    return [t for t in itertools.product(OPS, OPS) if run_try(numbers, t) is not None]


def puzzle_expression(numbers: tuple[int, ...], ops: Try) -> str:
    """`a op1 b op2 c` with brackets where precedence needs them: `(3 + 5) * 8`."""
    a, b, c = numbers
    inner = f"{a} {ops[0]} {b}"
    if ops[0] in "+-" and ops[1] in "*/":
        inner = f"({inner})"
    return f"{inner} {ops[1]} {c}"


def _wording(rng: random.Random, numbers: tuple[int, ...], target: int, script: str) -> str:
    listed = f"{numbers[0]}, {numbers[1]} {to_script('and', script)} {numbers[2]}"
    if rng.random() < 0.5:
        text = f"Use {listed} once each, with + - * /, to make {target}."
    else:
        text = f"Make {target} from {listed}. Use each number once, with + - * /."
    return to_script(text, script)


def draw_puzzles(spec: LogicWorld, seed: int, second_script_share: float) -> Iterator[Problem]:
    """An endless stream of distinct puzzles (by numbers and target), reproducible from `seed`."""
    rng = random.Random(seed)
    seen: set[str] = set()
    misses = 0
    while True:
        numbers = tuple(rng.randint(spec.min_number, spec.max_number) for _ in range(3))
        tries = valid_tries(numbers)
        solution = rng.choice(tries) if tries else None
        result = run_try(numbers, solution) if solution else None
        key = f"logic:{numbers}->{result[1] if result else None}"
        if result is None or not 1 <= result[1] <= spec.max_target or key in seen:
            misses += 1
            if misses > 10_000:
                raise ValueError(
                    f"the logic family has run out of distinct puzzles after {len(seen)}; raise "
                    "world.logic.max_number or max_target, or ask for fewer puzzles"
                )
            continue
        seen.add(key)
        misses = 0
        target = result[1]
        script = "greek" if rng.random() < second_script_share else "latin"
        a, b, c = numbers
        yield Problem(
            id=f"logic-{len(seen):06d}",
            question=_wording(rng, numbers, target, script),
            answer=str(target),
            language=script,
            source="tiny/logic",
            key=key,
            steps=(
                f"{a} {solution[0]} {b} = {result[0]}",
                f"{result[0]} {solution[1]} {c} = {target}",
            ),
            family="logic",
            numbers=numbers,
        )
