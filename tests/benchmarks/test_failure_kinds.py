"""The failure-kind diagnosis of wrong tiny-world answers, on hand-written completions."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.failure_kinds import failure_counts, failure_kind
from problems.loader import write_problems
from problems.types import Problem

STEPS = ("8 + 4 = 12", "12 - 3 = 9")


def think(steps: str, answer: str) -> str:
    check = "Let me check: 12 - 3 gives 9."
    return f"<think> First, {steps}. {check} </think> <answer> {answer} </answer>"


@pytest.mark.parametrize(
    ("completion", "kind"),
    [
        (think("8 + 4 = 12. Next, 12 - 3 = 9. Then 9 - 3 = 6", "6"), "step count"),
        (think("8 + 4 = 12", "12"), "step count"),
        (think("8 + 4 = 13. Next, 13 - 3 = 10", "10"), "arithmetic"),
        (think("8 + 4 = 12. Next, 12 - 2 = 10", "10"), "operands"),
        (think("8 + 4 = 12. Next, 12 + 3 = 15", "15"), "operands"),
        # the steps are right; the summary after </think> restates 12 - 3 = 8 wrongly
        (think("8 + 4 = 12. Next, 12 - 3 = 9", "the steps give 12 then 8. 12 - 3 = 8"), "summary"),
    ],
)
def test_failure_kind_takes_the_first_that_fits(completion, kind):
    assert failure_kind(completion, STEPS) == kind


def test_failure_counts_read_only_the_wrong_samples(tmp_path):
    heldout = write_problems(tmp_path / "heldout.jsonl", [Problem("p1", "q", "9", steps=STEPS)])
    samples = tmp_path / "eval_samples.parquet"
    rows = {
        "problem_id": ["p1", "p1", "p1"],
        "completion": [
            think("8 + 4 = 12. Next, 12 - 3 = 9", "9"),
            think("8 + 4 = 12", "12"),
            think("8 + 4 = 13. Next, 13 - 3 = 10", "10"),
        ],
        "correct": [True, False, False],
    }
    pq.write_table(pa.table(rows), samples)
    assert failure_counts(samples, heldout) == {"step count": 1, "arithmetic": 1}
    other = write_problems(tmp_path / "other.jsonl", [Problem("p2", "q", "9", steps=STEPS)])
    with pytest.raises(ValueError, match="lacks 1 problems"):
        failure_counts(samples, other)
