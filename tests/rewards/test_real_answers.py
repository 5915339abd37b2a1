"""Answers as real data sets state them (GSM8K, MATH) and as a model writes them: the accuracy
verifier pays an equivalent answer and nothing else. Each gold answer is what the loader keeps
(`final_answer_text`: a box's content, what follows `####`), each completion the project's format
with the answer written as a model would."""

from __future__ import annotations

import logging

import pytest

from problems.answers import boxed_contents, final_answer_text, last_boxed, worked_solution
from problems.types import Problem
from rewards.accuracy import gold_is_verifiable, grade, readable, verifiable_problems


def completion(answer: str) -> str:
    return f"<think> worked out </think> <answer> {answer} </answer>"


# (a model's answer, the data set's solution, right?)
CASES = [
    # MATH: LaTeX without delimiters is read as LaTeX, not as its first or last number
    (r"5\sqrt{3}", r"so the side is $\boxed{5\sqrt{2}}$", False),
    (r"5\sqrt{2}", r"so the side is $\boxed{5\sqrt{2}}$", True),
    (r"\boxed{3\sqrt{11}}", r"\boxed{3\sqrt{13}}", False),
    (r"(5, -1)", r"The point is $\boxed{(3, -1)}$.", False),
    (r"(3,-1)", r"The point is $\boxed{(3, -1)}$.", True),
    ("12", r"\boxed{12\pi}", False),
    (r"12\pi", r"\boxed{12\pi}", True),
    ("2", r"\boxed{\sqrt{2}}", False),
    (r"\sqrt{2}", r"\boxed{\sqrt{2}}", True),
    ("3", r"\boxed{\pi}", False),
    ("2x-3", r"\boxed{2x-3}", True),
    ("2x+3", r"\boxed{2x-3}", False),
    ("y=2x+3", r"\boxed{y = 2x + 3}", True),
    (r"\dfrac{1}{2}", r"\boxed{\frac{1}{2}}", True),
    ("0.5", r"\boxed{\frac{1}{2}}", True),
    ("1/2", r"\boxed{\dfrac{1}{2}}", True),
    (r"\frac{3}{4}.", r"\boxed{\dfrac{3}{4}}", True),
    ("C", r"\boxed{\text{(C)}}", True),
    ("(C)", r"\boxed{\text{(C)}}", True),
    ("B", r"\boxed{\text{(C)}}", False),
    ("(-2,7)", r"\boxed{[-2,7]}", False),
    ("[-2, 7]", r"\boxed{[-2,7]}", True),
    (r"\{1,2,3\}", r"\boxed{\{1,2,3\}}", True),
    ("90°", r"\boxed{90^\circ}", True),
    ("7", r"The answer is \fbox{7}.", True),
    ("3", r"The answer is \fbox{7}.", False),
    # GSM8K: a currency sign, thousands separators, prose around the number
    (r"\$1,600", "She has 1,600 dollars.\n#### 1,600", True),
    (r"\$72", "48/2 = <<48/2=24>>24 ...\n#### 72", True),
    (r"\boxed{\$1,600}", "#### 1,600", True),
    (r"The total is \$1,600.", "#### 1600", True),
    ("1,600", "#### 1600", True),
    ("1600 dollars", "#### 1600", True),
    ("x = 72", "#### 72", True),
    ("160", "#### 1,600", False),
    ("16000", "#### 1,600", False),
    # full-width digits and an answer in Chinese
    ("８", "#### 8", True),
    ("答案是8", "#### 8", True),
    ("答案是9", "#### 8", False),
]


@pytest.mark.parametrize(("answer", "solution", "right"), CASES, ids=[c[0] for c in CASES])
def test_an_equivalent_answer_is_paid_and_no_other(answer, solution, right):
    gold = final_answer_text(solution)
    assert gold_is_verifiable(gold)
    assert grade(completion(answer), gold).correct is right


@pytest.mark.parametrize(
    "gold",
    [r"\dfrac{3}{4}", "x^2+1", r"\text{(C)}", r"\$18.90", r"\{1,2,3\}", "[-2,7]", "p - q",
     r"\sqrt{2}", r"\pi", r"\frac{\sqrt{3}}{2}", r"\$32,\!348"],
)  # fmt: skip
def test_math_gold_answers_are_verifiable(gold):
    assert gold_is_verifiable(gold)


def test_plain_numbers_and_prose_are_left_to_the_verifiers_own_search():
    for text in ("17", "-3", "1 600", "12,5", "42+1", "72 clips", "The answer is 1,600."):
        assert readable(text) == text
    assert readable(r"5\sqrt{3}") == r"$5\sqrt{3}$"
    assert readable(r"3 \text{ cm}^2") == r"$3 \text{ cm}^2$"
    assert readable(r"so $x = 3$") == r"so $x = 3$"


def test_gsm8k_thousands_separators_go_and_other_commas_stay():
    assert final_answer_text("#### 1,600,000") == "1600000"
    assert final_answer_text("#### (3, -1)") == "(3, -1)"
    assert final_answer_text("#### 1,2") == "1,2"


def test_an_fbox_closes_a_worked_solution_as_a_box_does():
    assert final_answer_text(r"2 + 5 = 7, so \fbox{7}") == "7"
    assert worked_solution(r"2 + 5 = 7, so \fbox{7}") == r"2 + 5 = 7, so \fbox{7}"


def test_problems_a_verifier_cannot_judge_are_left_out_and_counted(caplog):
    def math(answer: str, i: int) -> Problem:
        return Problem(id=f"p{i}", question="?", answer=answer, family="math")

    problems = [math("4", 0), math("no answer here", 1), math("5", 2), math("???", 3)]
    with caplog.at_level(logging.WARNING, logger="rewards.accuracy"):
        kept = verifiable_problems(problems, "evaluation on heldout.jsonl")
    assert [p.id for p in kept] == ["p0", "p2"]
    assert "evaluation on heldout.jsonl: 2 of 4 problems left out" in caplog.text
    assert "first: p1" in caplog.text


def test_boxes_that_differ_in_the_answer_block_are_a_hedge():
    assert grade(completion(r"\boxed{73} \boxed{72}"), "72").correct is False
    assert grade(completion(r"\boxed{72} or \fbox{73}"), "72").correct is False
    assert grade(completion(r"\boxed{72}, so \boxed{72}"), "72").correct is True
    # without an answer block (lenient), the last box is the answer, as before
    assert grade(r"first \boxed{73}, then \boxed{72}", "72", strict=False).correct is True
    assert boxed_contents(r"\boxed{a{b}} x \fbox{2} \boxed{3") == ["a{b}", "2"]
    assert boxed_contents(r"} \boxed{\boxed{1} + 2} \boxed{") == [r"\boxed{1} + 2", "1"]
    for text in (r"\boxed{a{b}} x \fbox{2}", r"\boxed{\frac{1}{2}} and \boxed{3}", "no box"):
        assert boxed_contents(text)[-1:] == ([last_boxed(text)] if last_boxed(text) else [])


def test_an_answer_of_many_open_boxes_is_read_in_one_pass():
    text = "\\boxed{" * 20_000 + "1"
    assert boxed_contents(text) == []  # a scan from each opening would take minutes
    assert grade(completion(text), "1").correct is False
