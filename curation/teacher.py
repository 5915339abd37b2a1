"""A programmatic teacher writing long chain-of-thought traces for the tiny world's problems.

A trace reasons step by step, checks itself, then summarises: `<think> ... </think> <answer>
summary, answer </answer>`, the readable pattern DeepSeek-R1 asks of its cold-start data. For code
it builds the expression, checks it at an input and fixes a missing bracket the check reveals;
for logic puzzles it tries operations, checks each result against the target and tries again
(problems/worked.py writes each family's reasoning). The
teacher also makes the faults that R1-Zero outputs show (arithmetic slips, missing tags, mixed
languages, rambling, repetition loops, a bare answer with no summary, duplicates) at configured
rates, so every filter has something real to remove and its count means something.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from configs.supervised import TeacherConfig
from problems.corpus import other_script
from problems.scripts import to_script
from problems.types import Problem
from problems.worked import TEACHER, fence


@dataclass(frozen=True)
class Trace:
    problem_id: str
    question: str
    answer: str
    language: str
    completion: str
    fault: str  # "none" or the fault the teacher made on purpose, for inspection only
    family: str = "math"  # what grades it (rewards/verifiers.py), with the problem's tests
    tests: tuple[str, ...] = ()
    numbers: tuple[int, ...] = ()


def _fault(rng: random.Random, spec: TeacherConfig) -> str:
    roll = rng.random()
    faults = [
        ("slip", spec.slip_share),
        ("drop_tags", spec.drop_tags_share),
        ("mix_language", spec.mix_language_share),
        ("ramble", spec.ramble_share),
        ("repeat", spec.repeat_share),
        ("no_summary", spec.no_summary_share),
    ]
    edge = 0.0
    for name, share in faults:
        edge += share
        if roll < edge:
            return name
    return "none"


def _think(sentences: list[str], fault: str, script: str) -> str:
    if fault == "ramble":
        redo = ["Let me redo the whole computation to be sure.", *sentences[1:]]
        sentences = sentences + redo * 3
    if fault == "repeat":
        sentences = sentences + [sentences[-1]] * 3
    scripts = [script] * len(sentences)
    if fault == "mix_language":
        cut = max(1, len(sentences) // 2)
        scripts = [script if i < cut else other_script(script) for i in range(len(sentences))]
    return " ".join(to_script(s, sc) for s, sc in zip(sentences, scripts, strict=True))


def write_trace(problem: Problem, rng: random.Random, spec: TeacherConfig) -> tuple[str, str]:
    """One trace for `problem` and the name of the fault made ("none" for a clean trace)."""
    if problem.family not in TEACHER or (problem.family != "code" and not problem.steps):
        raise ValueError(
            f"problem {problem.id} has no worked steps: the programmatic teacher cannot trace it; "
            "give curated traces for real data instead"
        )
    fault = _fault(rng, spec)
    working = TEACHER[problem.family](problem, rng, slip=fault == "slip")
    script = problem.language
    think = _think(working.sentences, fault, script)
    summary = to_script(working.statement, script)
    if fault == "mix_language":  # the closing words too: a math trace reasons in equations alone
        summary = to_script(working.statement, other_script(script))
    if fault == "no_summary":
        summary = working.bare
    answer = " ".join(part for part in (summary, fence(working.code)) if part)
    if fault == "drop_tags":
        return f"{think} {answer}", fault
    return f"<think> {think} </think> <answer> {answer} </answer>", fault


def write_traces(problems: list[Problem], spec: TeacherConfig) -> list[Trace]:
    rng = random.Random(spec.seed)
    traces = []
    for problem in problems:
        for _ in range(spec.traces_per_problem):
            completion, fault = write_trace(problem, rng, spec)
            trace = Trace(
                problem.id,
                problem.question,
                problem.answer,
                problem.language,
                completion,
                fault,
                problem.family,
                problem.tests,
                problem.numbers,
            )
            traces.append(trace)
            if rng.random() < spec.duplicate_share:
                traces.append(Trace(**{**trace.__dict__, "fault": "duplicate"}))
    return traces
