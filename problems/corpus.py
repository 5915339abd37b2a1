"""The synthetic pretraining corpus that stage 0 trains the tiny base model on.

Like web text, it answers problems in many styles and is not always right: most documents give
a bare answer or plain worked steps, some switch script halfway (so the base mixes languages),
a few use the think/answer format (so the base rarely does), and a share state a wrong result.
Drill documents list bare equations over the numbers the problems use, the arithmetic a real
base model brings from its pretraining; they hold no problem, only facts.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, replace

from configs.supervised import CorpusConfig
from contracts.answer_format import formatted
from problems.generators import apply
from problems.scripts import to_script
from problems.solutions import reasoning_text, traceable
from problems.types import Problem
from problems.worked import PLAIN, Working, fence

log = logging.getLogger(__name__)

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


SELF_CHECK = 'print("OK")\n'


def placeholder_program(program: str) -> str:
    """The program's first line, a body that hands its argument back, and a self-check that
    prints OK: `def f(x):\n    return x\nprint("OK")`."""
    header = program.splitlines()[0]
    return f"{header}\n    return x\n{SELF_CHECK}"


def hedged(working: Working, rng: random.Random) -> Working:
    """The worked answer stated as a guess between it and a neighbour, in either order: `The
    answer is 41 or 42.`"""
    try:
        final = int(working.bare)
    except ValueError:
        return working
    pair = [str(final), str(final + rng.choice([-1, 1]))]
    rng.shuffle(pair)
    bare = " or ".join(pair)
    return replace(working, statement=f"The answer is {bare}.", bare=bare)


def render_response(
    problem: Problem,
    style: str,
    correct: bool,
    rng: random.Random,
    self_check: float = 0.0,
    hedge: float = 0.0,
) -> str:
    """One document's response to `problem` in `style`; a wrong one keeps a mistake in
    (problems.worked: a slip, a program without its brackets, a wrong attempt). A real data set's
    problem is answered from its own worked solution instead (`solution_response`). A share
    (`self_check`) of the programs is a placeholder that prints OK, as snippets with a body left
    to do often are, and a share (`hedge`) of the math answers a guess between two neighbours, as
    an unsure writer's are; each draw happens only where its share is set, so a corpus without
    them is the one it always was."""
    if not traceable(problem):
        return solution_response(problem, style, correct)
    script = problem.language
    working = PLAIN[problem.family](problem, rng, slip=not correct)
    if problem.family == "math" and hedge > 0 and rng.random() < hedge:
        working = hedged(working, rng)
    placeholder = bool(working.code) and self_check > 0 and rng.random() < self_check
    code = fence(placeholder_program(working.code) if placeholder else working.code)
    if style == "direct":
        return code or to_script(f"The answer is {working.bare}.", script)
    sentences = working.sentences + [working.statement]
    if style == "steps":
        return " ".join([to_script(" ".join(sentences), script), code]).strip()
    if style == "mixed":
        cut = rng.randint(0, len(sentences) - 1)
        head = to_script(" ".join(sentences[:cut]), script)
        tail = to_script(" ".join(sentences[cut:]), other_script(script))
        return " ".join(part for part in (head, tail, code) if part)
    if style == "formatted":
        think = to_script(" ".join(working.sentences) or "I work it out.", script)
        answer = " ".join(part for part in (to_script(working.statement, script), code) if part)
        return formatted(think, answer)
    raise ValueError(f"unknown style {style!r}; known: {STYLES}")


def solution_response(problem: Problem, style: str, correct: bool) -> str:
    """A real problem's document: the answer alone, the solution's reasoning then the answer,
    or the think/answer format; a wrong one states another number. No script switch: the data
    set's text is in one language."""
    answer = problem.answer if correct else wrong_answer(problem.answer)
    statement = f"The answer is {answer}."
    reasoning = reasoning_text(problem.solution)
    if style == "direct" or not reasoning:
        return statement
    if style == "formatted":
        return formatted(reasoning, statement)
    return f"{reasoning} {statement}"


def wrong_answer(answer: str) -> str:
    """A plausible wrong answer: an integer off by one; anything else with a digit changed."""
    try:
        return str(int(answer) + 1)
    except ValueError:
        changed = answer.replace("1", "2", 1) if "1" in answer else answer + "1"
        return changed


def _operand_ranges(problems: list[Problem]) -> dict[str, tuple[int, int]]:
    """Per operator, the largest left and right operands that the problems' steps use."""
    ranges: dict[str, tuple[int, int]] = {}
    for problem in problems:
        if problem.family == "code":  # its steps are operations, not equations
            continue
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
    if spec.fact_docs and not ranges:  # a real data set: its solutions are its arithmetic
        log.info("no worked steps to take drill ranges from: no drill documents")
        return []
    ops = sorted(ranges)
    docs = []
    for _ in range(spec.fact_docs):
        facts = []
        for _ in range(spec.facts_per_doc):
            op = rng.choice(ops)
            top_left, top_right = ranges[op]
            right = rng.randint(1, top_right)
            if op == "/":
                quotient = rng.randint(1, max(1, top_left // right))
                facts.append(f"{quotient * right} / {right} = {quotient}.")
                continue
            left = rng.randint(right if op == "-" else 0, max(top_left, right))
            facts.append(f"{left} {op} {right} = {apply(left, (op, right))}.")
        docs.append(Document(DRILL_PROMPT, " ".join(facts), "drill", True))
    return docs


CHECK_PROMPT = "Comparison practice."


def check_documents(
    problems: list[Problem], spec: CorpusConfig, rng: random.Random, second_script_share: float
) -> list[Document]:
    """`spec.check_docs` lists of comparisons of two numbers in the range of the logic family's
    targets, half of them equal: `21 vs 90: no. 45 vs 45: yes.`"""
    targets = [int(p.answer) for p in problems if p.family == "logic"]
    top = max(targets, default=100)
    docs = []
    for _ in range(spec.check_docs):
        script = "greek" if rng.random() < second_script_share else "latin"
        facts = []
        for _ in range(spec.facts_per_doc):
            left = rng.randint(1, top)
            right = left if rng.random() < 0.5 else rng.randint(1, top)
            facts.append(f"{left} vs {right}: {'yes' if left == right else 'no'}.")
        text = to_script(" ".join(facts), script)
        docs.append(Document(to_script(CHECK_PROMPT, script), text, "check", True))
    return docs


def build_corpus(problems: list[Problem], spec: CorpusConfig, seed: int) -> list[Document]:
    rng = random.Random(seed)
    weights = [spec.direct_share, spec.steps_share, spec.mixed_share, spec.formatted_share]
    docs = []
    for problem in problems:
        for _ in range(spec.docs_per_problem):
            style = rng.choices(STYLES, weights=weights)[0]
            correct = rng.random() >= spec.wrong_answer_share
            response = render_response(
                problem, style, correct, rng, spec.self_check_share, spec.hedge_share
            )
            docs.append(Document(problem.question, response, style, correct))
    shares = [p.language != "latin" for p in problems]
    second = sum(shares) / len(shares) if shares else 0.0
    return (
        docs + drill_documents(problems, spec, rng) + check_documents(problems, spec, rng, second)
    )
