import pytest

from contracts.answer_format import answer_block, is_well_formed
from problems.answers import final_answer_text, last_boxed
from rewards import REWARDS, get_reward
from rewards.accuracy import accuracy_reward, grade
from rewards.format import format_reward
from rewards.language import language_consistency, language_reward
from rewards.length import overlong_penalty
from rewards.registry import combine, safe_scores
from rewards.repetition import repeated_ngram_share, repetition_reward, repetition_share
from rewards.steps import check_steps
from rewards.tags import tag_count


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
        ("<think> \u200b\u2060 </think> <answer> 7 </answer>", False),
        ("<think> a </think> <answer> \u0301 </answer>", False),
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
    assert grade(r"<answer> The answer is \boxed{4}. </answer>", "#### 4").correct
    assert grade("<answer> The answer is 4. </answer>", r"so it is \boxed{4}").correct
    assert grade("<think> 4 </think> <answer> 5 </answer>", "4").correct is False
    assert grade("no number at all", "4").correct is False


def test_strict_grading_reads_only_the_one_answer_block():
    # no answer block: the trailing number is not an answer, however right it is
    assert grade(r"The answer is \boxed{4}.", "#### 4").correct is False
    assert grade("garbage 7 garbage 4", "4").correct is False
    # more than one answer block is a hedge, not an answer
    assert answer_block("<answer> 1 </answer> <answer> 2 </answer>") is None
    assert grade("<answer> 3 </answer> <answer> 4 </answer>", "4").correct is False
    # the think block never holds the answer
    assert grade("<think> 4 </think> <answer> 5 </answer>", "4").correct is False


def test_lenient_grading_reads_the_whole_completion_only_without_an_answer_block():
    assert grade(r"The answer is \boxed{4}.", "#### 4", strict=False).correct
    assert grade("The answer is 4.", r"so it is \boxed{4}", strict=False).correct
    assert grade("<answer> 5 </answer> 4", "4", strict=False).correct is False


def test_answers_too_costly_to_compare_are_wrong_not_a_hang():
    for costly in (r"$9^{9^{9}}$", r"$(10^{100})!$", r"$\binom{10^9}{10^5}$", r"$1000000!$"):
        assert grade(f"<answer> {costly} </answer>", "42").correct is False
    assert grade(r"<answer> $2^{10}$ </answer>", "1024").correct
    assert grade(r"<answer> $\frac{84}{2}$ </answer>", "42").correct


def test_accuracy_reward_is_none_when_gold_cannot_be_verified():
    completions = ["<answer> 4 </answer>", "<answer> 4 </answer>"]
    assert accuracy_reward(["q", "q"], completions, answer=["4", "not a number"]) == [1.0, None]
    assert accuracy_reward(["q"], ["4"], answer=["4"]) == [0.0]
    assert accuracy_reward(["q"], ["4"], answer=["4"], strict=False) == [1.0]


def test_language_consistency_by_script_ignores_tags():
    assert language_consistency("<think> Τηε ανσωερ </think> <answer> 4 </answer>", "greek") == 1.0
    assert language_consistency("The answer", "greek") == 0.0
    assert language_consistency("42", "latin") == 1.0
    mixed = language_consistency("abcd αβψδ", "latin")
    assert mixed == pytest.approx(0.5)
    assert language_reward(["", ""], ["abc", "αβψ"], language=["latin", "latin"]) == [1.0, 0.0]


def test_registry_by_name_binds_params():
    assert {"accuracy", "format", "tag_count", "language", "overlong", "repetition"} <= set(REWARDS)
    with pytest.raises(KeyError, match="unknown reward"):
        get_reward("nope")
    overlong = get_reward("overlong", max_tokens=10, buffer=4)
    assert overlong(["q"] * 3, ["a"] * 3, completion_tokens=[6, 8, 10]) == [0.0, -0.5, -1.0]


def test_tag_count_gives_partial_credit():
    assert tag_count("<think> a </think> <answer> 1 </answer>") == 1.0
    assert tag_count("<think> a </think> 1") == 0.5
    assert tag_count("42 <answer> 1 </answer>") == 0.5
    assert tag_count("<think><think> a </think>") == 0.0
    assert tag_count("") == 0.0


def test_tag_count_pays_nothing_for_tags_without_their_blocks():
    assert tag_count("<think></think><answer></answer>") == 0.0
    assert tag_count("</answer></think><answer><think>") == 0.0
    assert tag_count("<think> \u200b\u200d </think> <answer> \u2060 </answer>") == 0.0
    assert tag_count("<answer> 1 </answer> <think> a </think>") == 0.5


def test_overlong_penalty_is_linear_in_the_buffer():
    assert [overlong_penalty(n, 100, 20) for n in (50, 80, 90, 100, 130)] == [0, 0, -0.5, -1, -1]
    with pytest.raises(ValueError):
        overlong_penalty(5, 100, 0)


def test_repetition_share():
    assert repeated_ngram_share("a b c d e") == 0.0
    assert repeated_ngram_share("a b c a b c a b c") == pytest.approx(1 - 3 / 7)
    assert repetition_reward([""], ["x y"]) == [-0.0]
    assert repetition_share("abcabcabc", chars=3) == pytest.approx(1 - 3 / 7)


def test_repetition_sees_through_case_punctuation_invisible_characters_and_glue():
    loop = "the answer is five. " * 8
    plain = -repetition_reward([""], [loop])[0]
    assert plain > 0.5
    disguised = [
        "".join(w.upper() if i % 2 else w for i, w in enumerate(loop.split(" "))),
        loop.replace(" ", " \u200b"),
        loop.replace(".", "!").replace("answer", "answer,"),
        loop.replace(" ", ""),
    ]
    for text in disguised:
        assert -repetition_reward([""], [text])[0] >= plain, text
    assert repetition_share("First, 7 - 5 = 2. Next, 2 * 3 = 6. The answer is 6.") == 0.0
    # every disguise normalises to the same text, so to the same share
    assert {repetition_share(t) for t in disguised} == {plain}


def test_language_reward_reads_the_reasoning():
    mixed = "<think> Τηε στεπσ </think> <answer> the answer is 4 </answer>"
    assert language_reward([""], [mixed], language=["greek"]) == [1.0]
    assert language_reward([""], ["plain text"], language=["greek"]) == [0.0]


def test_language_reward_counts_words_hidden_in_markup_and_pays_nothing_without_words():
    honest = "<think> Τηε στεπσ γιωε 4 and then 5 </think> <answer> 5 </answer>"
    hidden = r"<think> Τηε στεπσ γιωε 4 \and \then 5 </think> <answer> 5 </answer>"
    tagged = "<think> Τηε στεπσ γιωε 4 <and> <then> 5 </think> <answer> 5 </answer>"
    score = language_reward([""] * 3, [honest, hidden, tagged], language=["greek"] * 3)
    assert score[1] <= score[0] and score[2] <= score[0] < 1.0
    math_only = r"<think> Τηε στεπ: $\frac{1}{2} \cdot 4 = 2$ </think> <answer> 2 </answer>"
    assert language_reward([""], [math_only], language=["greek"]) == [1.0]
    assert language_reward([""], ["<think> 3 + 4 = 7 </think> <answer> 7 </answer>"],
                           language=["greek"]) == [0.0]  # fmt: skip


def test_combine_skips_what_cannot_be_verified():
    per = {"accuracy": [1.0, None, None], "format": [1.0, 0.0, None]}
    assert combine(per, {"accuracy": 1.0, "format": 0.5}) == [1.5, 0.0, None]


def test_malformed_completions_never_raise():
    weird = ["", "<answer>", "\\boxed{", "</think></think>", "\x00" * 50, "9" * 5000]
    for name, fn in REWARDS.items():
        columns = {
            "answer": ["4"] * len(weird),
            "language": ["latin"] * len(weird),
            "completion_tokens": [len(w) for w in weird],
        }
        scores = safe_scores(fn, [""] * len(weird), weird, **columns)
        assert len(scores) == len(weird), name


def test_safe_scores_isolates_a_failing_sample():
    def fragile(prompts, completions, **_):
        return [1 / len(c) for c in completions]

    assert safe_scores(fragile, ["", ""], ["ab", ""]) == [0.5, None]


def test_step_checks_catch_wrong_facts_and_ungrounded_operands():
    question = "Start with 7. Subtract 5. Multiply by 2. What is the result?"
    text = "First, 7 - 4 = 3. Next, 3 * 2 = 6. Then 6 + 1 = 8. Check: 3 * 2 gives 6."
    checks = check_steps(question, text)
    # 4 is not in the question; 3 is an earlier result; 6 + 1 is wrong and 1 is ungrounded
    assert [c.correct for c in checks] == [False, True, False, True]
    assert [c.right for c in checks] == [True, True, False, True]
    assert [c.grounded for c in checks] == [False, True, False, True]
    assert [text[: c.end].rsplit(" ", 1)[-1] for c in checks] == ["3", "6", "8", "6"]


def test_step_checks_carry_stated_results_and_ignore_prose():
    question = "Mia has 10 books. Then Mia gives away 2. Then Mia sells 8."
    checks = check_steps(question, "10 - 2 = 8. Then 8 - 8 = 0. The answer is 0.")
    assert [c.correct for c in checks] == [True, True]
    assert check_steps(question, "No equations here, 10 and 2.") == []
    assert [c.correct for c in check_steps("6 and 0", "6 / 0 = 0")] == [False]


def test_a_logic_check_is_a_right_step_when_it_compares_the_last_result_with_the_target():
    from problems.scripts import to_script
    from rewards.steps import check_verdicts, process_steps

    text = (
        "2 + 8 = 10, 10 + 9 = 19. 19 vs 25: no. "
        "2 * 8 = 16, 16 + 9 = 25. 25 vs 25: yes. "
        "2 * 8 = 16, 16 - 9 = 7. 7 vs 25: yes. "  # a wrong verdict
        "16 vs 25: no. 7 vs 24: no."  # not the last result; not the target
    )
    checks = check_verdicts(text, "25")
    assert [(c.right, c.grounded) for c in checks] == [
        (True, True),
        (True, True),
        (False, True),
        (True, False),
        (True, False),
    ]
    greek = check_verdicts(to_script(text, "greek"), "25")
    assert [c.correct for c in greek] == [c.correct for c in checks]
    question = "Make 25 from 2, 8 and 9."
    steps = process_steps(question, text, "logic", "25")
    assert len(steps) == 6 + 5 and [s.end for s in steps] == sorted(s.end for s in steps)
    assert process_steps(question, "def f(x): return x + 1", "code", "") == []
