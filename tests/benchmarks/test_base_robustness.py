"""The base-robustness benchmark's diagnosis of where a base goes wrong."""

from benchmarks.base_robustness import step_rates


def test_step_rates_separate_wrong_arithmetic_from_operands_not_copied():
    questions = [
        "What is 14 - 8 + 7?",
        "Start with 9. Add 3. What is the result?",
        "What is 5 + 2?",
    ]
    completions = [
        "14 - 5 = 9. 9 + 7 = 16. The answer is 16.",  # right sums, 5 is not the question's 8
        "9 + 3 = 13. The answer is 13.",  # copied, wrong sum
        "The answer is 7.",  # no equations: counts for neither rate
    ]
    right, copied = step_rates(questions, completions)
    assert right == 2 / 3
    assert copied == 1 / 2
