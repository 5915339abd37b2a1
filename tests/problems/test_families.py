"""The tiny world's three families: generators, the corpus's and the teacher's working, and each
family's verifier judging what they write."""

import random
from fractions import Fraction

import pytest

from configs.data import CodeWorld, LogicWorld, MathWorld, WorldConfig
from configs.supervised import TeacherConfig
from curation.teacher import write_trace
from problems.corpus import STYLES, render_response
from problems.functions import function_expression
from problems.puzzles import OPS, puzzle_expression, run_try, valid_tries
from problems.world import split_world
from rewards.countdown import evaluate
from rewards.verifiers import grade_all

WORLD = WorldConfig(
    seed=5,
    math=MathWorld(n_train=60, n_heldout=10, max_steps=4),
    code=CodeWorld(n_train=40, n_heldout=10, max_ops=4),
    logic=LogicWorld(n_train=40, n_heldout=10, min_number=2),
)


@pytest.fixture(scope="module")
def world():
    return split_world(WORLD)


def run_reference(problem) -> bool:
    """The reference program against its tests, in this process (our own code)."""
    scope: dict = {}
    exec(problem.answer, scope)  # noqa: S102 - the generator's own program
    for test in problem.tests:
        exec(test, scope)  # noqa: S102 - the generator's own asserts
    return True


def test_every_family_in_its_counts_disjoint_and_reproducible(world):
    train, heldout = world
    count = {f: sum(p.family == f for p in heldout) for f in ("math", "code", "logic")}
    assert count == {"math": 10, "code": 10, "logic": 10}
    assert len(train) == 140
    assert not {p.key for p in train} & {p.key for p in heldout}
    assert split_world(WORLD) == world
    assert split_world(WORLD.model_copy(update={"seed": 6})) != world


def test_a_family_left_out_leaves_the_others_as_they_were(world):
    without_code = split_world(WORLD.model_copy(update={"code": None}))
    assert {p.key for p in without_code[1]} == {p.key for p in world[1] if p.family != "code"}


def test_code_tasks_have_a_reference_program_that_passes_their_tests(world):
    code = [p for p in world[0] + world[1] if p.family == "code"]
    assert all(run_reference(p) for p in code)
    assert all(len(p.tests) == 3 and p.answer.startswith("def ") for p in code)
    assert all(p.answer.split("(")[0] in p.question for p in code)  # the header is in the task


def test_function_expressions_bracket_a_sum_before_a_product():
    assert function_expression([("+", 3), ("*", 2)]) == "(x + 3) * 2"
    assert function_expression([("-", 3), ("*", 3), ("*", 2)]) == "(x - 3) * 3 * 2"
    assert function_expression([("+", 1), ("*", 2), ("+", 3), ("*", 2)]) == "((x + 1) * 2 + 3) * 2"
    assert function_expression([("*", 2), ("+", 3)]) == "x * 2 + 3"


def test_puzzles_have_a_solution_in_the_given_order(world):
    logic = [p for p in world[0] + world[1] if p.family == "logic"]
    for p in logic:
        first, second = (step.split()[1] for step in p.steps)
        value = evaluate(puzzle_expression(p.numbers, (first, second)))
        assert value is not None and value[0] == Fraction(p.answer)
        assert sorted(value[1]) == sorted(p.numbers)


@pytest.mark.parametrize("numbers", [(2, 5, 6), (6, 2, 4), (9, 3, 3), (7, 7, 2)])
def test_every_valid_try_stays_in_whole_positive_numbers_and_reads_back_exactly(numbers):
    tries = valid_tries(numbers)
    assert tries and all(t[0] in OPS and t[1] in OPS for t in tries)
    for ops in tries:
        first, final = run_try(numbers, ops)
        assert first > 0 and final > 0
        value, used = evaluate(puzzle_expression(numbers, ops))
        assert value == final and sorted(used) == sorted(numbers)


def test_clean_teacher_traces_are_right_by_their_family_verifier(world):
    rng = random.Random(0)
    problems = world[0]
    traces = [write_trace(p, rng, TeacherConfig.faultless())[0] for p in problems]
    grades = grade_all(problems, traces)
    wrong = [
        (p.family, t) for p, t, g in zip(problems, traces, grades, strict=True) if not g.correct
    ]
    assert not wrong, wrong[:2]


def test_slipped_teacher_traces_are_wrong_by_their_family_verifier(world):
    rng = random.Random(1)
    slip = TeacherConfig(
        slip_share=1.0,
        drop_tags_share=0,
        mix_language_share=0,
        ramble_share=0,
        repeat_share=0,
        no_summary_share=0,
        duplicate_share=0,
    )
    problems = [p for p in world[0] if p.family != "logic" or len(valid_tries(p.numbers)) > 1]
    traces = [write_trace(p, rng, slip) for p in problems]
    assert all(fault == "slip" for _, fault in traces)
    grades = grade_all(problems, [t for t, _ in traces])
    assert not [t for g, (t, _) in zip(grades, traces, strict=True) if g.correct is not False]


def test_the_teacher_tries_checks_and_tries_again(world):
    rng = random.Random(2)
    latin = [p for p in world[0] if p.language == "latin"]
    logic = [p for p in latin if p.family == "logic"]
    code = [p for p in latin if p.family == "code" and "(" in p.answer.split("return")[1]]
    logic_traces = [write_trace(p, rng, TeacherConfig.faultless())[0] for p in logic]
    assert any(t.count(" vs ") > 1 for t in logic_traces)  # attempts that fail, then another
    for trace in logic_traces:  # every check but the last says no
        checks = [part.split(":")[1].split(".")[0].strip() for part in trace.split(" vs ")[1:]]
        assert checks[-1] == "yes" and all(c == "no" for c in checks[:-1])
    for problem in code:  # the code teacher builds the expression, brackets and all
        trace = write_trace(problem, rng, TeacherConfig.faultless())[0]
        assert problem.answer.split("return ")[1].strip() in trace


@pytest.mark.parametrize("style", STYLES)
def test_the_corpus_writes_each_family_in_each_style(world, style):
    rng = random.Random(3)
    problems = world[0][:30]
    texts = [render_response(p, style, True, rng) for p in problems]
    grades = grade_all(problems, texts, strict=False)
    assert all(g.correct is True for g in grades), [
        t for t, g in zip(texts, grades, strict=True) if not g.correct
    ]
    code = [t for p, t in zip(problems, texts, strict=True) if p.family == "code"]
    assert all("```python\ndef " in t for t in code)
