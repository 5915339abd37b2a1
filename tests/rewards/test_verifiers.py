"""The logic family's verifier against worked examples and a slow reference, and the grade of a
completion by its problem's family."""

import random
from fractions import Fraction

import pytest

from problems.types import Problem
from rewards.code import CodeReward
from rewards.countdown import countdown_reward, evaluate, last_expression, reaches
from rewards.language import language_consistency, prose
from rewards.registry import RewardSet
from rewards.verifiers import grade_all, grade_readings

PUZZLE = Problem("l1", "Make 64 from 3, 5 and 8.", "64", family="logic", numbers=(3, 5, 8))


def answer(text: str) -> str:
    return f"<think> I try. </think> <answer> {text} </answer>"


@pytest.mark.parametrize(
    ("stated", "right"),
    [
        ("The attempt that works is (3 + 5) * 8.", True),
        ("(5 + 3) * 8", True),  # any order of the numbers
        ("8 * (3 + 5) = 64", True),  # the result after the expression is not an expression
        ("3 + 5 * 8", False),  # precedence: 43
        ("(3 + 5) * 8 * 1", False),  # a number not given
        ("(3 + 3) * 8", False),  # a number used twice, one left out
        ("8 * 8", False),  # 3 + 5 folded into a number of its own
        ("64", False),  # the target alone uses no number
        ("2 ** 6", False),  # powers are not arithmetic here
        ("(3 + 5) * 8 or 3 * 5 + 8", False),  # only the last expression counts
        ("__import__('os').system('x')", False),
        ("(" * 60 + "3" + ")" * 60, False),
    ],
)
def test_the_stated_expression_must_use_the_numbers_and_reach_the_target(stated, right):
    assert countdown_reward([""], [answer(stated)], [PUZZLE.numbers], [PUZZLE.answer]) == [
        float(right)
    ]


def test_division_is_exact_and_by_zero_is_wrong():
    assert reaches("6 * 2 / 4", (6, 2, 4), "3")
    assert reaches("6 / 4 * 2", (6, 2, 4), "3")  # a fraction on the way is fine
    assert not reaches("6 / (2 - 2)", (6, 2, 2), "3")
    assert not reaches("7 / 2", (7, 2), "3")


def test_strict_reads_the_answer_block_and_lenient_the_last_expression():
    bare = "Try 3 + 5 = 8, then 8 * 8 = 64. The attempt that works is (3 + 5) * 8."
    assert countdown_reward([""], [bare], [(3, 5, 8)], ["64"]) == [0.0]
    assert countdown_reward([""], [bare], [(3, 5, 8)], ["64"], strict=False) == [1.0]
    assert last_expression("so 8 * 8 = 64.") == "8 * 8"
    assert last_expression("no arithmetic here") is None


def reference_value(expression: str) -> Fraction | None:
    """The slow, obvious reading: Python evaluates the expression with every number a Fraction."""
    wrapped = "".join(f"Fraction({ch})" if ch.isdigit() else ch for ch in expression)
    try:
        return eval(wrapped, {"Fraction": Fraction, "__builtins__": {}})  # noqa: S307 - digits/ops
    except ZeroDivisionError:
        return None


def random_expression(rng: random.Random, depth: int) -> str:
    if depth == 0 or rng.random() < 0.3:
        return str(rng.randint(1, 9))
    op = rng.choice("+-*/")
    return f"({random_expression(rng, depth - 1)} {op} {random_expression(rng, depth - 1)})"


def test_evaluation_agrees_with_the_slow_reference_on_random_expressions():
    rng = random.Random(0)
    for _ in range(500):
        expression = random_expression(rng, 4)
        got = evaluate(expression)
        want = reference_value(expression)
        assert (got[0] if got else None) == want, expression
        if got:
            assert sorted(got[1]) == sorted(int(ch) for ch in expression if ch.isdigit())


def test_each_family_is_graded_by_its_own_verifier():
    math = Problem("m1", "What is 2 + 3?", "5")
    code = Problem(
        "c1", "def f(x): add 1", "", family="code", tests=("assert f(1) == 2", "assert f(5) == 6")
    )
    program = "```python\ndef f(x):\n    return x + 1\n```"
    wrong = "```python\ndef f(x):\n    return x + 2\n```"
    problems = [math, math, code, code, code, PUZZLE, PUZZLE]
    texts = [
        answer("5"),
        answer("6"),
        answer(program),
        answer(wrong),
        program,  # no answer block: only a lenient reading finds it
        answer("(3 + 5) * 8"),
        answer("3 * 5 + 8"),
    ]
    strict = [g.correct for g in grade_all(problems, texts)]
    assert strict == [True, False, True, False, False, True, False]
    lenient = [g.correct for g in grade_all(problems, texts, strict=False)]
    assert lenient == [True, False, True, False, True, True, False]


class CountingRunner(CodeReward):
    def __init__(self):
        super().__init__()
        self.judged: list[str] = []

    def __call__(self, prompts, completions, tests, **kw):
        self.judged += completions
        return super().__call__(prompts, completions, tests, **kw)


def test_the_same_program_for_the_same_tests_is_judged_once():
    code = Problem("c1", "", "", family="code", tests=("assert f(1) == 2",))
    text = answer("```python\ndef f(x):\n    return x + 1\n```")
    runner = CountingRunner()
    grades = grade_all([code] * 6, [text] * 6, runner=runner)
    assert [g.correct for g in grades] == [True] * 6 and len(runner.judged) == 1


class SessionCountingRunner(CountingRunner):
    def __init__(self):
        super().__init__()
        self.sessions = 0

    def __call__(self, prompts, completions, tests, **kw):
        self.sessions += 1
        return super().__call__(prompts, completions, tests, **kw)


def test_strict_and_lenient_grades_share_one_sandbox_session_and_each_program_runs_once():
    code = Problem("c1", "", "", family="code", tests=("assert f(1) == 2",))
    math = Problem("m1", "What is 2 + 3?", "5")
    right = "```python\ndef f(x):\n    return x + 1\n```"
    wrong = "```python\ndef f(x):\n    return x\n```"
    problems = [code, code, code, code, math, math, PUZZLE]
    texts = [
        answer(right),  # both readings find it: run once
        right,  # only the lenient reading finds it: the same program, not run again
        answer(wrong),
        f"{wrong} <answer> no program here </answer>",  # the lenient reading finds one
        answer("5"),
        "so it is 5",  # only the lenient reading
        "(3 + 5) * 8",
    ]
    runner = SessionCountingRunner()
    strict, lenient = grade_readings(problems, texts, runner=runner)
    assert runner.sessions == 1 and len(runner.judged) == 2
    assert strict == grade_all(problems, texts, strict=True)
    assert lenient == grade_all(problems, texts, strict=False)
    assert [g.correct for g in strict] == [True, False, False, False, True, False, False]
    assert [g.correct for g in lenient] == [True, True, False, False, True, True, True]


def test_a_program_in_the_answer_is_not_prose_but_code_elsewhere_is():
    program = "```python\ndef f(x):\n    return x\n```"
    greek = f"<think> Σταρτ ωιτη χ. </think> <answer> Τηε φθνψτιον. {program} </answer>"
    assert "def" not in prose(greek) and language_consistency(greek, "greek") == 1.0
    hidden = (
        "<think> Σταρτ ```the words hide here``` </think> <answer> Τηε ```python\nx\n``` </answer>"
    )
    assert language_consistency(hidden, "greek") < 0.7


def test_rewards_limited_to_families_score_only_those():
    rewards = RewardSet(
        {}, {}, {"a": None, "g": frozenset({"general"})}, {"a": frozenset({"code"})}
    )
    assert rewards.applies("a", "reasoning", "code")
    assert not rewards.applies("a", "reasoning", "math")
    assert not rewards.applies("a", "general", "math")  # a family reward scores no general prompt
    assert rewards.applies("g", "general", "math") and not rewards.applies("g", "reasoning", "code")
