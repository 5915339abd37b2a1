"""Seeded generators of the tiny world's multi-step problems.

Each problem is a start value and a chain of operations. Its identity (`key`) is that chain, so
two wordings of the same arithmetic are the same problem. Wordings: a bare expression, a chain of
instructions, and a short story; each in either script.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from configs.data import MathWorld
from problems.scripts import to_script
from problems.types import Problem

Op = tuple[str, int]  # ("+", 5)

_NAMES = ["Tom", "Ana", "Raj", "Mia", "Leo", "Zoe", "Sam", "Ivy"]
_ITEMS = ["apples", "coins", "books", "stamps", "shells", "pens", "cards", "eggs"]
_STORY_ADD = ["buys {n} more", "finds {n} more", "gets {n} more from a friend"]
_STORY_SUB = ["gives away {n}", "loses {n}", "sells {n}"]
_CHAIN_WORDS = {"+": "Add {n}", "-": "Subtract {n}", "*": "Multiply by {n}"}


def apply(value: int, op: Op) -> int:
    sym, n = op
    if sym == "+":
        return value + n
    if sym == "-":
        return value - n
    if sym == "*":
        return value * n
    raise ValueError(f"unknown operation {sym!r}")


def worked_steps(start: int, ops: list[Op]) -> list[str]:
    """Each intermediate result as an equation: ["7 + 5 = 12", "12 * 2 = 24"]."""
    steps, value = [], start
    for op in ops:
        new = apply(value, op)
        steps.append(f"{value} {op[0]} {op[1]} = {new}")
        value = new
    return steps


def _draw_chain(rng: random.Random, spec: MathWorld, story: bool) -> tuple[int, list[Op]]:
    value = rng.randint(2, spec.max_operand + 6)
    start, ops = value, []
    for _ in range(rng.randint(spec.min_steps, spec.max_steps)):
        choices = ["+", "-"] if story else ["+", "-", "*"]
        sym = rng.choice(choices)
        if (sym == "*" and value > 20) or (sym == "-" and value == 0):
            sym = "+"
        n = rng.randint(2, 3) if sym == "*" else rng.randint(1, spec.max_operand)
        if sym == "-" and n > value:
            n = rng.randint(1, value)
        ops.append((sym, n))
        value = apply(value, (sym, n))
    return start, ops


def expression(start: int | str, ops: list[Op]) -> str:
    """Infix form that evaluates left to right under the usual precedence; `start` may be a
    name (the code family's argument)."""
    expr, has_sum = str(start), False
    for sym, n in ops:
        expr = f"({expr}) * {n}" if sym == "*" and has_sum else f"{expr} {sym} {n}"
        has_sum = (has_sum and sym != "*") or sym in "+-"  # a bracketed sum is a product now
    return expr


def _wording(rng: random.Random, kind: str, start: int, ops: list[Op]) -> str:
    if kind == "expression":
        return f"What is {expression(start, ops)}?"
    if kind == "chain":
        parts = [f"Start with {start}."] + [_CHAIN_WORDS[s].format(n=n) + "." for s, n in ops]
        return " ".join(parts) + " What is the result?"
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    parts = [f"{name} has {start} {item}."]
    for sym, n in ops:
        verb = rng.choice(_STORY_ADD if sym == "+" else _STORY_SUB).format(n=n)
        parts.append(f"Then {name} {verb}.")
    parts.append(f"How many {item} does {name} have now?")
    return " ".join(parts)


def draw_problems(spec: MathWorld, seed: int, second_script_share: float) -> Iterator[Problem]:
    """An endless stream of distinct problems (by key), reproducible from `seed`."""
    rng = random.Random(seed)
    seen: set[str] = set()
    misses = 0
    while True:
        kind = rng.choice(["expression", "chain", "story"])
        start, ops = _draw_chain(rng, spec, story=kind == "story")
        key = f"{start}" + "".join(f"{s}{n}" for s, n in ops)
        if key in seen:
            misses += 1
            if misses > 10_000:
                raise ValueError(
                    f"the math family has run out of distinct problems after {len(seen)}; "
                    "raise world.math.max_steps or max_operand, or ask for fewer problems"
                )
            continue
        seen.add(key)
        misses = 0
        script = "greek" if rng.random() < second_script_share else "latin"
        steps = worked_steps(start, ops)
        yield Problem(
            id=f"tiny-{len(seen):06d}",
            question=to_script(_wording(rng, kind, start, ops), script),
            answer=str(evaluate(start, ops)),
            language=script,
            source=f"tiny/{kind}",
            key=key,
            steps=tuple(steps),
            family="math",
        )


def evaluate(start: int, ops: list[Op]) -> int:
    value = start
    for op in ops:
        value = apply(value, op)
    return value
