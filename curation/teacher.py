"""A programmatic teacher writing long chain-of-thought traces for problems with worked steps.

A trace reasons step by step, checks itself, then summarises: `<think> ... </think> <answer>
summary, answer </answer>`, the readable pattern DeepSeek-R1 asks of its cold-start data. The
teacher also makes the faults that R1-Zero outputs show (arithmetic slips, missing tags, mixed
languages, rambling, repetition loops, a bare answer with no summary, duplicates) at configured
rates, so every filter has something real to remove and its count means something.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from configs.schema import TeacherConfig
from problems.corpus import other_script
from problems.scripts import to_script
from problems.types import Problem

_CONNECTORS = ["First", "Next", "Then", "After that", "Finally"]


@dataclass(frozen=True)
class Trace:
    problem_id: str
    question: str
    answer: str
    language: str
    completion: str
    fault: str  # "none" or the fault the teacher made on purpose, for inspection only


def _results_with_slip(problem: Problem, rng: random.Random, slip: bool) -> list[tuple[str, int]]:
    """(left-hand side, result) per step; a slip puts one result off and carries it forward."""
    pairs, carry = [], None
    slip_at = rng.randrange(len(problem.steps)) if slip else -1
    for i, step in enumerate(problem.steps):
        lhs, rhs = (part.strip() for part in step.split("="))
        left, op, right = lhs.split(" ")
        value = int(left) if carry is None else carry
        result = {"+": value + int(right), "-": value - int(right), "*": value * int(right)}[op]
        if i == slip_at:
            result += rng.choice([-2, -1, 1, 2])
        pairs.append((f"{value} {op} {right}", result))
        carry = result
    return pairs


def _reasoning(pairs: list[tuple[str, int]]) -> list[str]:
    sentences = ["Let me work through this step by step."]
    for i, (lhs, result) in enumerate(pairs):
        connector = _CONNECTORS[min(i, len(_CONNECTORS) - 2)] if i < len(pairs) - 1 else "Finally"
        if len(pairs) == 1:
            connector = "First"
        sentences.append(f"{connector}, {lhs} = {result}.")
    lhs, result = pairs[-1]
    sentences.append(f"Let me check the last step: {lhs} gives {result}, which matches.")
    return sentences


def _summary(pairs: list[tuple[str, int]], start: str) -> str:
    results = [str(r) for _, r in pairs]
    path = " then ".join(results)
    return f"Starting from {start}, the steps give {path}. The answer is {results[-1]}."


def write_trace(problem: Problem, rng: random.Random, spec: TeacherConfig) -> tuple[str, str]:
    """One trace for `problem` and the name of the fault made ("none" for a clean trace)."""
    if not problem.steps:
        raise ValueError(
            f"problem {problem.id} has no worked steps: the programmatic teacher cannot trace it; "
            "give curated traces for real data instead"
        )
    roll = rng.random()
    faults = [
        ("slip", spec.slip_share),
        ("drop_tags", spec.drop_tags_share),
        ("mix_language", spec.mix_language_share),
        ("ramble", spec.ramble_share),
        ("repeat", spec.repeat_share),
        ("no_summary", spec.no_summary_share),
    ]
    fault, edge = "none", 0.0
    for name, share in faults:
        edge += share
        if roll < edge:
            fault = name
            break
    pairs = _results_with_slip(problem, rng, slip=fault == "slip")
    start = problem.steps[0].split(" ")[0]
    think = _reasoning(pairs)
    if fault == "ramble":
        for _ in range(3):
            think += ["Let me redo the whole computation to be sure."] + _reasoning(pairs)[1:]
    if fault == "repeat":
        think += [think[-1]] * 3
    script = problem.language
    think_text = " ".join(to_script(s, script) for s in think)
    if fault == "mix_language":
        cut = max(1, len(think) // 2)
        think_text = " ".join(
            to_script(s, script if i < cut else other_script(script)) for i, s in enumerate(think)
        )
    summary = to_script(_summary(pairs, start), script)
    if fault == "no_summary":
        summary = str(pairs[-1][1])
    if fault == "drop_tags":
        return f"{think_text} {summary}", fault
    return f"<think> {think_text} </think> <answer> {summary} </answer>", fault


def write_traces(problems: list[Problem], spec: TeacherConfig) -> list[Trace]:
    rng = random.Random(spec.seed)
    traces = []
    for problem in problems:
        for _ in range(spec.traces_per_problem):
            completion, fault = write_trace(problem, rng, spec)
            trace = Trace(
                problem.id, problem.question, problem.answer, problem.language, completion, fault
            )
            traces.append(trace)
            if rng.random() < spec.duplicate_share:
                traces.append(Trace(**{**trace.__dict__, "fault": "duplicate"}))
    return traces
