"""Code problems as data sets ship them, loaded and judged: MBPP's asserts in `test_list`, APPS's
stdin/stdout `input_output`, a list of input and output cases; and what cannot be judged refused
at load, not paid: HumanEval's `def check(candidate)` (it asserts nothing until called), an MBPP
row read without its tests (its reference program would be a math answer, and a number in the
code its gold)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from problems.loader import ProblemFileError, load_problems, read_problems
from rewards.accuracy import grade
from rewards.code import CodeReward
from sandbox import capabilities

CAPS = capabilities()
judged = pytest.mark.skipif(
    not (CAPS.runs_programs and (CAPS.namespaces or CAPS.uid_drop)),
    reason=f"the sandbox refuses or cannot run programs here: {CAPS.reason}",
)

MBPP = {
    "task_id": 17,
    "text": "Write a function to find the perimeter of a square.",
    "code": "def square_perimeter(a):\r\n  perimeter=4*a\r\n  return perimeter",
    "test_list": ["assert square_perimeter(10)==40", "assert square_perimeter(5)==20"],
    "test_setup_code": "",
}
HUMANEVAL = {
    "task_id": "HumanEval/53",
    "prompt": 'def add(x: int, y: int):\n    """Add two numbers x and y"""\n',
    "canonical_solution": "    return x + y\n",
    "test": "METADATA = {}\n\n\ndef check(candidate):\n    assert candidate(2, 3) == 5\n",
    "entry_point": "add",
}
APPS = {
    "question": "Read two integers and print their sum.",
    "solutions": "[]",
    "input_output": json.dumps({"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]}),
}


def answer(code: str) -> str:
    return f"<think> write it </think>\n<answer>\n```python\n{code}\n```\n</answer>"


def write(tmp_path: Path, *rows: dict) -> Path:
    path = tmp_path / "code.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def score(tests: tuple[str, ...], program: str) -> tuple[float | None, dict[str, float]]:
    reward = CodeReward()
    (value,) = reward([""], [answer(program)], [list(tests)])
    return value, reward.pop_metrics()


@judged
def test_mbpp_loads_by_its_tests_column_and_is_judged_by_its_asserts(tmp_path):
    (problem,), _ = read_problems(write(tmp_path, MBPP), "text", "code", tests_field="test_list")
    assert problem.family == "code" and problem.tests == tuple(MBPP["test_list"])
    assert score(problem.tests, "def square_perimeter(a):\n    return 4 * a") == (
        1.0,
        {"passed": 2},
    )
    value, why = score(problem.tests, "def square_perimeter(a):\n    return a * a")
    assert value == 0.0 and why == {"assertion": 2.0}


def test_mbpp_read_without_its_tests_is_refused_not_a_math_problem(tmp_path):
    assert grade("<answer> 4 </answer>", MBPP["code"]).correct  # what it would have paid
    with pytest.raises(ProblemFileError, match=r"'code' is a program, and a code problem is"):
        read_problems(write(tmp_path, MBPP), "text", "code")


def test_a_general_prompt_may_have_a_program_for_its_answer(tmp_path):
    row = {"question": "Write a greeting function.", "kind": "general",
           "answer": "def greet(name):\n    return f'Hello, {name}!'"}  # fmt: skip
    (problem,), _ = read_problems(write(tmp_path, row))
    assert problem.kind == "general" and problem.answer.startswith("def greet")


def test_humanevals_check_asserts_nothing_and_is_refused(tmp_path):
    """Called or not, `check(candidate)` asserts inside a function handed the program's own: the
    judge, which hands values across and never functions, could not run it."""
    fields = ("prompt", "canonical_solution")
    for test in (HUMANEVAL["test"], HUMANEVAL["test"] + "\ncheck(add)\n"):
        path = write(tmp_path, HUMANEVAL | {"test": test})
        with pytest.raises(ProblemFileError, match=r"'test' test 1 asserts nothing outside"):
            read_problems(path, *fields, tests_field="test")


@judged
@pytest.mark.parametrize("as_text", [True, False])
def test_apps_stdin_stdout_cases_are_judged_by_output(tmp_path, as_text):
    row = APPS if as_text else APPS | {"input_output": json.loads(APPS["input_output"])}
    (problem,), _ = read_problems(write(tmp_path, row), tests_field="input_output")
    assert problem.family == "code" and len(problem.tests) == 2 and problem.answer == ""
    right = "a, b = map(int, input().split())\nprint(a + b)\nexit()"  # exit() as site gives it
    assert score(problem.tests, right) == (1.0, {"passed": 2})
    for wrong in ("print('wrong')", "pass"):
        value, why = score(problem.tests, wrong)
        assert value == 0.0 and why == {"wrong_output": 2.0}


def test_stdin_stdout_problems_read_back_from_the_prepared_files_as_they_were(tmp_path):
    """The problems stage writes each case as JSON text; every later stage reads that file: a
    case must come back a case, not an assert-style test that asserts nothing."""
    from configs.data import DataConfig
    from stages import problems as problems_stage

    mbpp = {"question": MBPP["text"], "input_output": MBPP["test_list"]}
    train = write(tmp_path, APPS, mbpp)
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text(json.dumps(APPS | {"question": "Print the difference."}) + "\n")
    files = {"train_path": train, "heldout_path": heldout, "tests_field": "input_output"}
    config = DataConfig(source="files", files=files)

    prepared = problems_stage.run(config, tmp_path / "prepared")

    read, _ = read_problems(train, tests_field="input_output")
    assert [len(p.tests) for p in read] == [2, 2] and read[0].tests[0].startswith('{"input"')
    assert load_problems(prepared.train_path) == read
    assert load_problems(prepared.heldout_path)[0].tests == read[0].tests


@judged
def test_a_list_of_input_and_output_cases_loads_without_an_answer(tmp_path):
    cases = [{"input": "2\n", "output": "4\n"}, {"input": "3\n", "output": "6\n"}]
    row = {"question": "Double it.", "tests": cases}
    (problem,), _ = read_problems(write(tmp_path, row))
    assert score(problem.tests, "print(2 * int(input()))") == (1.0, {"passed": 2})


@pytest.mark.parametrize(
    ("tests", "says"),
    [
        ({"inputs": [[1, 2]], "outputs": [3], "fn_name": "add"}, "calls a function by name"),
        ({"inputs": ["1"], "outputs": []}, "not inputs and outputs of one length"),
        ([{"input": 1, "output": "1"}], "case 1 is not an 'input' and an 'output' of text"),
        (["assert f(1) ==", "x = 1"], "test 1 is not Python"),
        (["x = 1"], "test 1 asserts nothing outside"),
        ([3], "test 1 is a int"),
    ],
)
def test_tests_that_cannot_judge_a_program_are_refused(tmp_path, tests, says):
    row = {"question": "q?", "answer": "", "tests": tests}
    with pytest.raises(ProblemFileError, match=r"code\.jsonl:1: wrong_type: 'tests' "):
        read_problems(write(tmp_path, row))
    with pytest.raises(ProblemFileError, match=says):
        read_problems(write(tmp_path, row))
