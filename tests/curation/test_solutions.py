"""Cold-start traces from reference solutions: GSM8K's calculator annotations and `####` line
go, MATH's `\\boxed{}` stays, and the trace passes the filters and rewards the pipeline uses."""

import json

import pytest

from configs.profiles import ConfigError, load_profile
from configs.supervised import CurationConfig, FilterConfig
from contracts.answer_format import is_well_formed
from curation.filters import apply_filters
from curation.reference_traces import solution_traces
from problems.answers import worked_solution
from problems.loader import load_problems, read_problems, write_problems
from problems.solutions import reasoning_text, solution_trace
from problems.types import Problem
from rewards.accuracy import grade
from stages.curation import candidate_traces

GSM8K = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)
MATH = (
    "We have $\\frac{1}{2} + \\frac{1}{3} = \\frac{3}{6} + \\frac{2}{6}$, "
    "so the sum is $\\boxed{\\frac{5}{6}}$."
)


def gsm8k(solution: str = GSM8K, answer: str = "72") -> Problem:
    return Problem("g1", "How many clips did Natalia sell?", answer, solution=solution)


def test_gsm8k_annotations_and_the_answer_line_are_stripped():
    assert reasoning_text(GSM8K) == (
        "Natalia sold 48/2 = 24 clips in May.\n"
        "Natalia sold 48+24 = 72 clips altogether in April and May."
    )
    trace = solution_trace(gsm8k())
    assert trace == (
        f"<think> {reasoning_text(GSM8K)} </think> <answer> The answer is 72. </answer>"
    )
    assert is_well_formed(trace) and grade(trace, "72").correct is True


def test_math_keeps_its_box_and_boxes_the_answer():
    problem = Problem("m1", "What is 1/2 + 1/3?", "\\frac{5}{6}", solution=MATH)
    trace = solution_trace(problem)
    assert trace == (
        f"<think> {MATH} </think> <answer> The answer is $\\boxed{{\\frac{{5}}{{6}}}}$. </answer>"
    )
    assert is_well_formed(trace) and grade(trace, "\\frac{5}{6}").correct is True
    assert grade(trace, "\\frac{1}{6}").correct is False


def test_a_problem_without_a_solution_is_skipped_and_counted():
    problems = [gsm8k(), gsm8k(solution=""), Problem("t", "1 + 1?", "2")]
    traces, skipped = solution_traces(problems)
    assert [t.problem_id for t in traces] == ["g1"] and skipped == 2
    traces, counts = candidate_traces(CurationConfig(source="solutions"), problems)
    assert counts == {"no_solution": 2} and len(traces) == 1


def test_solution_traces_pass_the_curation_filters():
    traces, _ = solution_traces(
        [gsm8k(), Problem("m", "1/2 + 1/3?", "\\frac{5}{6}", solution=MATH)]
    )
    result = apply_filters(traces, FilterConfig(max_tokens=400), lambda t: len(t.split()))
    assert len(result.kept) == 2, result.counts


@pytest.mark.parametrize(
    ("text", "worked"),
    [
        (GSM8K, True),
        (MATH, True),
        ("#### 72", False),
        ("72", False),
        ("\\boxed{72}", False),
        ("$\\boxed{72}$", False),
        ("The answer is 72", False),  # no marker: nothing says where the answer is
    ],
)
def test_worked_solutions_are_told_from_bare_answers(text, worked):
    assert worked_solution(text) == (text if worked else "")


def test_the_loader_keeps_the_solution_and_our_files_keep_it_apart(tmp_path):
    raw = tmp_path / "gsm8k.jsonl"
    rows = [
        {"question": "How many clips?", "answer": GSM8K},
        {"question": "A bare one?", "answer": "#### 5"},
        {"problem": "unused", "question": "MATH style?", "answer": MATH},
    ]
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems, _ = read_problems(raw)
    assert [p.answer for p in problems] == ["72", "5", "\\frac{5}{6}"]
    assert [p.solution for p in problems] == [GSM8K, "", MATH]
    again = load_problems(write_problems(tmp_path / "ours.jsonl", problems))
    assert again == problems
    written = [json.loads(line) for line in (tmp_path / "ours.jsonl").read_text().splitlines()]
    assert "solution" not in written[1]  # no solution, no column: the tiny world's files as before


def test_solutions_need_real_data():
    with pytest.raises(ConfigError, match="curation.source 'solutions' needs data"):
        load_profile("micro", ["curation.source=solutions"])


def test_curation_reads_the_training_file_no_further_than_max_problems(tmp_path, tokenizer):
    """A large data set's prepared file is read up to `max_problems`, not whole and then cut:
    the row after them, unreadable, is never reached."""
    from models.saved import ModelRef
    from problems.types import ProblemSet
    from stages import curation
    from stages.tracker import NullTracker

    train = write_problems(tmp_path / "train.jsonl", [gsm8k(), gsm8k()])
    with train.open("a") as f:
        f.write("not a row of the prepared file\n")
    base = tmp_path / "base"
    tokenizer.save_pretrained(base)
    problems = ProblemSet(train, train, n_train=3, n_heldout=3)
    config = CurationConfig(source="solutions", max_problems=2)

    curated = curation.run(config, problems, ModelRef(base), tmp_path / "out", NullTracker())

    assert curated.n_candidates == 2
