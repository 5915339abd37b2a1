import pytest

from problems.answers import final_answer_text, last_boxed
from rewards import REWARDS, get_reward
from rewards.accuracy import accuracy_reward, grade
from rewards.format import answer_block, format_reward, is_well_formed
from rewards.language import language_consistency, language_reward


@pytest.mark.parametrize(
    "text,expected",
    [
        ("She pays 6 + 36 = 42 dollars.\n#### 42", "42"),
        ("#### 1,234", "1234"),
        (r"so $x = \boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
        (r"\boxed{3} then \boxed{4}", "4"),
        (" 17 ", "17"),
    ],
)
def test_final_answer_text(text, expected):
    assert final_answer_text(text) == expected


def test_last_boxed_balances_braces_and_handles_unclosed():
    assert last_boxed(r"\boxed{a{b}c}") == "a{b}c"
    assert last_boxed(r"\boxed{open") is None


@pytest.mark.parametrize(
    "completion,well_formed",
    [
        ("<think> 3 + 4 = 7 </think> <answer> 7 </answer>", True),
        ("<think>a</think>\n<answer>b</answer>\n", True),
        ("<think> </think> <answer> 7 </answer>", False),
        ("<answer> 7 </answer> <think> x </think>", False),
        ("<think> a </think> <answer> 7 </answer> trailing", False),
        ("<think> a <think> b </think> <answer> 7 </answer>", False),
        ("The answer is 7.", False),
    ],
)
def test_format(completion, well_formed):
    assert is_well_formed(completion) is well_formed
    assert format_reward([""], [completion]) == [float(well_formed)]


def test_grade_reads_answer_block_gsm8k_and_boxed_gold():
    assert grade("<think> 2 + 2 = 4 </think> <answer> The answer is 4. </answer>", "#### 4").correct
    assert grade(r"The answer is \boxed{4}.", "#### 4").correct
    assert grade("The answer is 4.", r"so it is \boxed{4}").correct
    assert grade("<think> 4 </think> <answer> 5 </answer>", "4") == grade(
        "<think> 4 </think> <answer> 5 </answer>", "4"
    )
    assert grade("<think> 4 </think> <answer> 5 </answer>", "4").correct is False
    assert grade("no number at all", "4").correct is False
    assert answer_block("<answer> 1 </answer> <answer> 2 </answer>") == "2"


def test_accuracy_reward_is_none_when_gold_cannot_be_verified():
    assert accuracy_reward(["q", "q"], ["4", "4"], answer=["4", "not a number"]) == [1.0, None]


def test_language_consistency_by_script_ignores_tags():
    assert language_consistency("<think> Τηε ανσωερ </think> <answer> 4 </answer>", "greek") == 1.0
    assert language_consistency("The answer", "greek") == 0.0
    assert language_consistency("42", "latin") == 1.0
    mixed = language_consistency("abcd αβψδ", "latin")
    assert mixed == pytest.approx(0.5)
    assert language_reward(["", ""], ["abc", "αβψ"], language=["latin", "latin"]) == [1.0, 0.0]


def test_registry_by_name():
    assert set(REWARDS) == {"accuracy", "format", "language"}
    with pytest.raises(KeyError, match="unknown reward"):
        get_reward("nope")
