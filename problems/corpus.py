"""The synthetic pretraining corpus that stage 0 trains the tiny base model on.

Like web text, it answers problems in many styles and is not always right: most documents give
a bare answer or plain worked steps, some switch script halfway (so the base mixes languages),
a few use the think/answer format (so the base rarely does), and a share state a wrong result.
Drill documents list bare equations over the numbers the problems use, the arithmetic a real
base model brings from its pretraining; they hold no problem, only facts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from configs.schema import CorpusConfig
from problems.generators import apply
from problems.scripts import to_script
from problems.types import Problem

STYLES = ("direct", "steps", "mixed", "formatted")
DRILL_PROMPT = "Arithmetic practice."


@dataclass(frozen=True)
class Document:
    question: str
    response: str
    style: str
    correct: bool


def other_script(script: str) -> str:
    return "greek" if script == "latin" else "latin"


def _perturbed(answer: str, rng: random.Random) -> str:
    value = int(answer)
    delta = rng.choice([-3, -2, -1, 1, 2, 3])
    return str(value + delta if value + delta >= 0 else value + abs(delta))


def _step_sentences(problem: Problem, final: str) -> list[str]:
    steps = list(problem.steps)
    if steps:
        lhs = steps[-1].rsplit("=", 1)[0].strip()
        steps[-1] = f"{lhs} = {final}"
    return [f"{s}." for s in steps] + [f"The answer is {final}."]


def render_response(problem: Problem, style: str, final: str, rng: random.Random) -> str:
    script = problem.language
    if style == "direct":
        return to_script(f"The answer is {final}.", script)
    sentences = _step_sentences(problem, final)
    if style == "steps":
        return to_script(" ".join(sentences), script)
    if style == "mixed":
        cut = rng.randint(0, len(sentences) - 1)
        head = to_script(" ".join(sentences[:cut]), script)
        tail = to_script(" ".join(sentences[cut:]), other_script(script))
        return f"{head} {tail}".strip()
    if style == "formatted":
        think = to_script(" ".join(sentences[:-1]) or "I compute it.", script)
        return f"<think> {think} </think> <answer> {final} </answer>"
    raise ValueError(f"unknown style {style!r}; known: {STYLES}")


def _operand_ranges(problems: list[Problem]) -> dict[str, tuple[int, int]]:
    """Per operator, the largest left and right operands that the problems' steps use."""
    ranges: dict[str, tuple[int, int]] = {}
    for problem in problems:
        for step in problem.steps:
            left, op, right = step.split("=")[0].split()
            top_left, top_right = ranges.get(op, (0, 0))
            ranges[op] = (max(top_left, int(left)), max(top_right, int(right)))
    return ranges


def drill_documents(
    problems: list[Problem], spec: CorpusConfig, rng: random.Random
) -> list[Document]:
    """`spec.fact_docs` lists of true equations in the problems' operand ranges."""
    ranges = _operand_ranges(problems)
    if spec.fact_docs and not ranges:
        raise ValueError("drill documents need problems with worked steps to take ranges from")
    ops = sorted(ranges)
    docs = []
    for _ in range(spec.fact_docs):
        facts = []
        for _ in range(spec.facts_per_doc):
            op = rng.choice(ops)
            top_left, top_right = ranges[op]
            right = rng.randint(1, top_right)
            left = rng.randint(right if op == "-" else 0, max(top_left, right))
            facts.append(f"{left} {op} {right} = {apply(left, (op, right))}.")
        docs.append(Document(DRILL_PROMPT, " ".join(facts), "drill", True))
    return docs


def build_corpus(problems: list[Problem], spec: CorpusConfig, seed: int) -> list[Document]:
    rng = random.Random(seed)
    weights = [spec.direct_share, spec.steps_share, spec.mixed_share, spec.formatted_share]
    docs = []
    for problem in problems:
        for _ in range(spec.docs_per_problem):
            style = rng.choices(STYLES, weights=weights)[0]
            correct = rng.random() >= spec.wrong_answer_share
            final = problem.answer if correct else _perturbed(problem.answer, rng)
            docs.append(
                Document(
                    problem.question, render_response(problem, style, final, rng), style, correct
                )
            )
    return docs + drill_documents(problems, spec, rng)
