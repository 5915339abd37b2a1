"""The code reward: the fraction of hidden tests passed, 0 for every way a program can fail, None
only when the sandbox cannot judge, and its counts of why tests failed."""

from __future__ import annotations

import pytest

import sandbox.runner as runner
from rewards.code import CodeReward, code_reward, extract_code, parse_tests
from rewards.registry import get_reward, verifier_metrics
from sandbox import capabilities

CAPS = capabilities()
pytestmark = pytest.mark.skipif(
    not (CAPS.runs_programs and (CAPS.namespaces or CAPS.uid_drop)),
    reason=f"the sandbox refuses or cannot run programs here: {CAPS.reason}",
)


def answer(code: str) -> str:
    return f"<think> write it </think>\n<answer>\n```python\n{code}```\n</answer>"


DOUBLE_SMALL = answer("n = int(input())\nprint(n * 2 if n < 3 else n)\n")
STDIO_TESTS = [
    {"input": "1", "output": "2"},
    {"input": "2\n", "output": "4\n"},
    {"input": "5", "output": "10"},
]
DOUBLE = answer("def double(x):\n    return 2 * x\n")


def test_the_reward_is_the_fraction_of_stdio_tests_passed():
    assert code_reward(["p"], [DOUBLE_SMALL], [STDIO_TESTS]) == [pytest.approx(2 / 3)]


def test_assert_style_tests_as_json_and_as_a_bare_string():
    tests = '[{"code": "assert double(2) == 4"}, {"code": "assert double(3) == 5"}]'
    assert code_reward(["p"] * 2, [DOUBLE] * 2, [tests, "assert double(21) == 42"]) == [0.5, 1.0]


def test_stdio_and_assert_tests_of_one_sample_count_together():
    main = "if __name__ == '__main__':\n    print(double(int(input())))\n"
    code = answer("def double(x):\n    return 2 * x\n" + main)
    tests = [
        {"input": "4", "output": "8"},
        {"code": "assert double(4) == 8"},
        {"code": "assert double(1) == 3"},
    ]
    assert code_reward(["p"], [code], [tests]) == [pytest.approx(2 / 3)]


def test_assert_tests_compare_type_and_value():
    floats = answer("def double(x):\n    return 2.0 * x\n")
    tuples = answer("def pair(x):\n    return (x, x)\n")
    ones = answer("def is_even(x):\n    return 1 - x % 2\n")
    texts = answer("def double(x):\n    return str(2 * x)\n")
    rewards = code_reward(
        ["p"] * 4,
        [floats, tuples, ones, texts],
        [
            ["assert double(2) == 4", "assert abs(double(2) - 4) < 1e-9"],
            "assert pair(1) == [1, 1]",
            "assert is_even(4) == True",
            "assert double(2) == '4'",
        ],
    )
    # numbers compare by value (2.0 == 4 / 2 as in Python); a tuple is not a list; 1 is not True
    assert rewards == [1.0, 0.0, 0.0, 1.0]


def test_tests_may_use_the_standard_library_and_expect_exceptions():
    code = answer(
        "import math\ndef root(x):\n    if x < 0:\n        raise ValueError(x)\n"
        "    return math.sqrt(x)\n"
    )
    tests = [
        {"code": "assert math.isclose(root(2), 1.41421356, rel_tol=1e-6)"},
        {"code": "try:\n    root(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False"},
        {"code": "for x in range(5):\n    assert root(x * x) == x"},  # 2.0 == 2, by value
    ]
    assert code_reward(["p"], [code], [tests]) == [1.0]


def test_objects_of_the_program_can_be_called_but_not_compared():
    code = answer(
        "class Solution:\n    def twice(self, xs):\n        return [2 * x for x in xs]\n"
        "class Box:\n    pass\n"
        "def make():\n    return Box()\n"
    )
    tests = [
        "assert Solution().twice([1, 2]) == [2, 4]",
        "assert make() == make()",  # only plain data compares
        "assert make()",  # nor has a truth value: its __bool__ would be the program's
    ]
    assert code_reward(["p"], [code], [tests]) == [pytest.approx(1 / 3)]


def test_a_function_named_like_a_module_is_the_programs_when_called():
    code = answer("def calendar(year):\n    return year % 4 == 0\n")
    tests = ["assert calendar(2024) == True", "assert calendar(2023) == False"]
    assert code_reward(["p"], [code], [tests]) == [1.0]


def test_edge_cases():
    completions = [
        "no code at all",
        answer("while True:\n    pass\n"),
        DOUBLE_SMALL,
        DOUBLE_SMALL,
        "<answer>\n```python\nunterminated",
        DOUBLE,
    ]
    tests = [
        STDIO_TESTS,
        [{"input": "", "output": ""}],
        [],
        "{not json",
        STDIO_TESTS,
        "assert double(2) ==",
    ]
    scores = code_reward(["p"] * 6, completions, tests, wall_seconds=1.5, cpu_seconds=1)
    # no code: 0; a loop: 0; no tests: None; a test that is not Python: None (it cannot judge)
    assert scores == [0.0, 0.0, None, None, 0.0, None]


def test_code_is_read_only_from_the_answer_block_unless_lenient():
    outside = "```python\nprint(int(input()) * 2)\n```"
    tests = [[{"input": "3", "output": "6"}]]
    assert code_reward(["p"], [outside], tests) == [0.0]
    assert code_reward(["p"], [outside], tests, strict=False) == [1.0]
    assert (
        extract_code(
            "```python\nprint('draft')\n```\n<answer>```python\nprint('final')\n```</answer>"
        )
        == "print('final')\n"
    )
    assert extract_code("<answer>42</answer>") is None
    assert parse_tests("assert f(1) == 1") == [{"code": "assert f(1) == 1"}]


def test_the_sample_is_none_when_the_sandbox_fails(monkeypatch):
    monkeypatch.setattr(runner, "PYTHON", "/nonexistent/bin/python3")
    reward = CodeReward()
    assert reward(["p"], [DOUBLE_SMALL], [STDIO_TESTS]) == [None]
    assert reward.pop_metrics() == {"sandbox_failed": 3.0, "unscorable": 1.0}


def test_registered_and_counting_why_tests_failed():
    reward = get_reward("code", wall_seconds=1.5, cpu_seconds=1)
    completions = [
        DOUBLE_SMALL,
        answer("raise SystemExit(0)\n"),
        answer("import os\nos.kill(os.getpid(), 40)\n"),
        answer("print('x' * 10**6)\n"),
        "no code",
    ]
    scores = reward(["p"] * 5, completions, [STDIO_TESTS] * 5)
    assert scores == [pytest.approx(2 / 3), 0.0, 0.0, 0.0, 0.0]
    metrics = verifier_metrics({"code": reward})
    assert metrics == {
        "reward/code/no_code": 1.0,
        "reward/code/output_limit": 3.0,
        "reward/code/passed": 2.0,
        "reward/code/signal": 3.0,
        "reward/code/wrong_output": 4.0,
    }
    assert verifier_metrics({"code": reward}) == {}  # counted once
