"""The tiny world's code family: write a small Python function from a description.

A task is a chain of operations on the argument ("Start with x. Add 3. Multiply by 2."), asked
for as a named function; hidden assert-style tests (`assert f(2) == 10`) judge the program in the
sandbox (rewards/code.py). The expression that computes it needs brackets wherever a sum is then
multiplied, which is where a program written without working it out goes wrong. Wordings: a
chain of instructions and one sentence; the words in either script, the function's name and
argument always in Latin letters, as code is.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from configs.data import CodeWorld
from problems.generators import Op, apply, expression
from problems.scripts import to_script
from problems.types import Problem

# The function's name. The task's header names it, but a small base does not learn to copy a
# name from the task (25 one-letter names: right by chance, docs/world.md), so every task uses
# one and the family is about the body.
NAME = "f"
ARG = "x"
_CHAIN = {"+": "Add {n}.", "-": "Subtract {n}.", "*": "Multiply by {n}."}
_SENTENCE = {"+": "adds {n}", "-": "subtracts {n}", "*": "multiplies by {n}"}


def draw_ops(rng: random.Random, spec: CodeWorld) -> list[Op]:
    """A chain of operations; a product follows a sum or difference often, as brackets then
    matter."""
    ops: list[Op] = []
    for _ in range(rng.randint(spec.min_ops, spec.max_ops)):
        sym = rng.choice(["+", "-", "*"])
        n = rng.randint(2, 3) if sym == "*" else rng.randint(1, spec.max_constant)
        ops.append((sym, n))
    return ops


def function_expression(ops: list[Op]) -> str:
    """The Python expression of the chain on the argument: `(x + 3) * 2`."""
    return expression(ARG, ops)


def function_source(name: str, ops: list[Op]) -> str:
    return f"def {name}({ARG}):\n    return {function_expression(ops)}\n"


def run_chain(value: int, ops: list[Op]) -> int:
    for op in ops:
        value = apply(value, op)
    return value


def describe(rng: random.Random, name: str, ops: list[Op], script: str) -> str:
    """The task in words (in `script`, the argument too where the words name it), ending with
    the function's first line as code, in Latin letters, as the program must begin."""
    if rng.random() < 0.5:
        steps = " ".join(_CHAIN[s].format(n=n) for s, n in ops)
        words = f"Write a Python function. Start with {ARG}. {steps} Return the result."
    else:
        said = ", then ".join(_SENTENCE[s].format(n=n) for s, n in ops)
        words = f"Write a Python function that takes a number, {said}, and returns the result."
    return f"{to_script(words + ' Begin with:', script)} def {name}({ARG}):"


def test_inputs(rng: random.Random, count: int) -> list[int]:
    return sorted(rng.sample(range(0, 10), count))


def draw_function_tasks(
    spec: CodeWorld, seed: int, second_script_share: float
) -> Iterator[Problem]:
    """An endless stream of distinct tasks (by chain), reproducible from `seed`."""
    rng = random.Random(seed)
    seen: set[str] = set()
    misses = 0
    while True:
        ops = draw_ops(rng, spec)
        key = "code:" + "".join(f"{s}{n}" for s, n in ops)
        if key in seen:
            misses += 1
            if misses > 10_000:
                raise ValueError(
                    f"the code family has run out of distinct tasks after {len(seen)}; raise "
                    "world.code.max_ops or max_constant, or ask for fewer tasks"
                )
            continue
        seen.add(key)
        misses = 0
        name = NAME
        script = "greek" if rng.random() < second_script_share else "latin"
        inputs = test_inputs(rng, spec.tests)
        tests = tuple(f"assert {name}({x}) == {run_chain(x, ops)}" for x in inputs)
        yield Problem(
            id=f"code-{len(seen):06d}",
            question=describe(rng, name, ops, script),
            answer=function_source(name, ops),
            language=script,
            source="tiny/code",
            key=key,
            steps=tuple(f"{s} {n}" for s, n in ops),
            family="code",
            tests=tests,
        )
