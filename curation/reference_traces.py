"""Cold-start traces from a data set's own reference solutions (GSM8K, MATH).

Real problems have no worked steps for the programmatic teacher, but they come with worked
solutions written by people. DeepSeek-R1 collects its cold-start data from several sources,
human-annotated long CoT among them, post-processed into one readable format; here the
solution is the reasoning and a one-line summary states the answer:

    <think> solution, as written </think> <answer> The answer is 72. </answer>

GSM8K's calculator annotations (`48/2 = <<48/2=24>>24`) are tool-use markup, not reasoning, and
go; its `#### 72` line becomes the summary. A MATH solution already states its answer in
`\\boxed{}` and keeps it; the summary boxes the answer too, as the grader reads it. The traces
then go through the same filters as the teacher's.
"""

from __future__ import annotations

from curation.teacher import Trace
from problems.solutions import solution_trace
from problems.types import Problem


def solution_traces(problems: list[Problem]) -> tuple[list[Trace], int]:
    """A trace per problem that has a solution, and how many had none (skipped)."""
    traces = []
    for problem in problems:
        completion = solution_trace(problem)
        if completion is not None:
            traces.append(
                Trace(
                    problem.id,
                    problem.question,
                    problem.answer,
                    problem.language,
                    completion,
                    "none",
                )
            )
    return traces, len(problems) - len(traces)
