"""How each family's problems are worked, in the words the corpus and the teacher use.

A `Working` is a solution in parts, in Latin letters (the caller renders it in the problem's
script): the reasoning sentences, the readable closing statement, the bare final answer, and for
code the program, which stays in Latin letters in every script. `plain` is how web text works a
problem (the pretraining corpus); `teacher` is the long chain of thought of the cold-start
teacher, which checks its work and, for code and logic, revises an attempt the check rejects.
A `slip` is a mistake left in: a wrong result, a program without its brackets, a wrong attempt
taken for a solution.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from problems.functions import ARG, function_expression, function_source
from problems.generators import Op, apply
from problems.puzzles import Try, puzzle_expression, run_try, valid_tries
from problems.types import Problem

_CONNECTORS = ["First", "Next", "Then", "After that", "Finally"]


@dataclass(frozen=True)
class Working:
    sentences: list[str]  # the reasoning, one sentence each
    statement: str  # the readable close: what was found, and the answer
    bare: str  # the final answer alone
    code: str = ""  # the program (code family), in Latin letters whatever the script


def fence(code: str) -> str:
    return f"```python\n{code}```" if code else ""


def chain_ops(problem: Problem) -> list[Op]:
    """The code task's operations, from its steps ("+ 3")."""
    return [(step.split()[0], int(step.split()[1])) for step in problem.steps]


# ---- math ---------------------------------------------------------------------------------------


def _math_pairs(problem: Problem, rng: random.Random, slip: bool) -> list[tuple[str, int]]:
    """(left-hand side, result) per step; a slip puts one result off and carries it forward."""
    pairs, carry = [], None
    slip_at = rng.randrange(len(problem.steps)) if slip else -1
    for i, step in enumerate(problem.steps):
        left, op, right = step.split("=")[0].split()
        value = int(left) if carry is None else carry
        result = apply(value, (op, int(right)))
        if i == slip_at:
            result += rng.choice([-2, -1, 1, 2])
        pairs.append((f"{value} {op} {right}", result))
        carry = result
    return pairs


def math_plain(problem: Problem, rng: random.Random, slip: bool = False) -> Working:
    pairs = _math_pairs(problem, rng, slip)
    final = str(pairs[-1][1])
    return Working(
        [f"{lhs} = {result}." for lhs, result in pairs], f"The answer is {final}.", final
    )


def math_teacher(problem: Problem, rng: random.Random, slip: bool = False) -> Working:
    """The worked steps as the base writes them, then the answer stated plainly. The answer
    repeats the last step's result, which ends the reasoning right before it: a check or a
    summary of every result between them made the small model miscopy it."""
    pairs = _math_pairs(problem, rng, slip)
    final = str(pairs[-1][1])
    sentences = [
        "Let me work through this step by step.",
        *(f"{left} = {right}." for left, right in pairs),
    ]
    return Working(sentences, f"The answer is {final}.", final)


# ---- code ---------------------------------------------------------------------------------------


def _built(ops: list[Op]) -> list[str]:
    """The expression after each operation: ["x + 3", "(x + 3) * 2"]."""
    return [function_expression(ops[: i + 1]) for i in range(len(ops))]


def _unbracketed(ops: list[Op]) -> str:
    return " ".join([ARG] + [f"{s} {n}" for s, n in ops])


_VERB = {"+": "Add {n}", "-": "Subtract {n}", "*": "Multiply by {n}"}


def _name(problem: Problem) -> str:
    return problem.tests[0].split("(")[0].removeprefix("assert ").strip()


def _slipped(ops: list[Op], rng: random.Random) -> str:
    """A wrong expression for the chain: its brackets left out, or else a constant off by one."""
    if _unbracketed(ops) != function_expression(ops):
        return _unbracketed(ops)
    i = rng.randrange(len(ops))
    wrong = [(s, n + 1 if j == i else n) for j, (s, n) in enumerate(ops)]
    return function_expression(wrong)


def code_plain(problem: Problem, rng: random.Random, slip: bool = False) -> Working:
    ops, name = chain_ops(problem), _name(problem)
    built = _built(ops)
    sentences = [f"Start with {ARG}."] + [
        f"{_VERB[s].format(n=n)}: {expr}." for (s, n), expr in zip(ops, built, strict=True)
    ]
    code = function_source(name, ops)
    if slip:
        code = f"def {name}({ARG}):\n    return {_slipped(ops, rng)}\n"
    return Working(sentences, "The function is:", "", code)


def code_teacher(problem: Problem, rng: random.Random, slip: bool = False) -> Working:
    """Build the expression operation by operation, bracketing a sum before it is multiplied,
    and write the program right after it. A slip leaves a wrong expression in. (A first attempt
    without its brackets and a check that fixed it cost the cold-start model 12 points of code
    pass@1: it miscopied the fix; docs/world.md.)"""
    ops, name = chain_ops(problem), _name(problem)
    built = _built(ops)
    sentences = ["Let me build the expression step by step.", f"Start with {ARG}."]
    sentences += [
        f"{_VERB[s].format(n=n)}: {expr}." for (s, n), expr in zip(ops, built, strict=True)
    ]
    final = built[-1]
    if slip:
        final = _slipped(ops, rng)
        sentences[-1] = f"{_VERB[ops[-1][0]].format(n=ops[-1][1])}: {final}."
    # the program right after the expression it writes out: a summary of the operations in
    # between made the small model write the program from its (miscopied) summary
    return Working(sentences, "The function is:", "", f"def {name}({ARG}):\n    return {final}\n")


# ---- logic --------------------------------------------------------------------------------------


def _solution(problem: Problem) -> Try:
    first, second = problem.steps
    return (first.split()[1], second.split()[1])


def _try_sentence(numbers: tuple[int, ...], ops: Try, target: int) -> str:
    """One attempt and its check, tersely (a search of several fits the token budget); the
    check puts the result beside the target before it says whether they agree."""
    first, final = run_try(numbers, ops) or (0, 0)
    a, b, c = numbers
    verdict = "yes" if final == target else "no"
    attempt = f"{a} {ops[0]} {b} = {first}, {first} {ops[1]} {c} = {final}."
    return f"{attempt} {final} vs {target}: {verdict}."


def logic_tries(
    problem: Problem, rng: random.Random, max_wrong: int, min_wrong: int = 0
) -> list[Try]:
    """Some wrong attempts, in a random order, then the solution."""
    numbers, target = problem.numbers, int(problem.answer)
    wrong = [t for t in valid_tries(numbers) if run_try(numbers, t)[1] != target]  # type: ignore[index]
    rng.shuffle(wrong)
    count = rng.randint(min(min_wrong, len(wrong)), min(max_wrong, len(wrong)))
    return wrong[:count] + [_solution(problem)]


def logic_plain(problem: Problem, rng: random.Random, slip: bool = False) -> Working:
    return _logic(problem, rng, slip, intro=[], max_wrong=3)


def logic_teacher(problem: Problem, rng: random.Random, slip: bool = False) -> Working:
    return _logic(problem, rng, slip, intro=["Let me try the operations in turn."], max_wrong=3)


def _logic(
    problem: Problem, rng: random.Random, slip: bool, intro: list[str], max_wrong: int
) -> Working:
    numbers, target = problem.numbers, int(problem.answer)
    tries = logic_tries(problem, rng, max_wrong, min_wrong=1 if slip else 0)
    if slip and len(tries) > 1:  # a wrong attempt taken for the answer
        tries = tries[:-1]
    sentences = intro + [_try_sentence(numbers, t, target) for t in tries]
    if slip and len(tries) >= 1:
        sentences[-1] = sentences[-1].rsplit(":", 1)[0] + ": yes."
    expression = puzzle_expression(numbers, tries[-1])
    return Working(sentences, f"The attempt that works is {expression}.", expression)


PLAIN = {"math": math_plain, "code": code_plain, "logic": logic_plain}
TEACHER = {"math": math_teacher, "code": code_teacher, "logic": logic_teacher}
