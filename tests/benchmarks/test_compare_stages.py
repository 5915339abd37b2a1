"""Paired stage differences over the same held-out problems, against numbers worked by hand."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.compare_stages import paired, per_problem


def samples(tmp_path, name, rows):
    path = tmp_path / f"{name}.parquet"
    table = {
        "problem_id": [r[0] for r in rows],
        "family": [r[1] for r in rows],
        "correct": [r[2] for r in rows],
        "correct_lenient": [r[3] for r in rows],
    }
    pq.write_table(pa.table(table), path)
    return path


def test_the_difference_is_paired_per_problem_with_its_standard_error(tmp_path):
    before = per_problem(
        samples(
            tmp_path,
            "before",
            [
                ("a", "math", 0, 0),
                ("a", "math", 0, 1),
                ("b", "code", 0, 0),
                ("b", "code", 0, 0),
                ("c", "code", 1, 1),
                ("c", "code", 1, 1),
            ],
        ),
        strict=False,
    )
    after = per_problem(
        samples(
            tmp_path,
            "after",
            [
                ("a", "math", 1, 1),
                ("a", "math", 1, 1),
                ("b", "code", 1, 1),
                ("b", "code", 0, 0),
                ("c", "code", 1, 1),
                ("c", "code", 1, 1),
            ],
        ),
        strict=False,
    )
    assert before == {"a": ("math", 0.5), "b": ("code", 0.0), "c": ("code", 1.0)}
    diff, sem, n = paired(after, before)
    # per problem: +0.5, +0.5, 0; mean 1/3; stdev sqrt(1/12); over sqrt(3)
    assert (diff, n) == (pytest.approx(1 / 3), 3)
    assert sem == pytest.approx((1 / 12) ** 0.5 / 3**0.5)
    assert paired(after, before, "code")[:2] == (pytest.approx(0.25), pytest.approx(0.25))
    with pytest.raises(ValueError, match="fewer than two problems in common of math"):
        paired(after, before, "math")
