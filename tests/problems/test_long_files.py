"""A data set of hundreds of thousands of rows says how far its read has come."""

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq

from problems.loader import read_problems

PROGRESS_ROWS = 100_000  # a long file says how far it has read each time it has read this many rows

ROWS = PROGRESS_ROWS * 5 // 4


def rows(n: int) -> list[dict[str, str]]:
    return [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(n)]


def progress_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "rows read" in r.getMessage()]


def test_a_long_jsonl_file_says_how_far_into_the_file_its_read_has_come(tmp_path, caplog):
    path = tmp_path / "long.jsonl"
    lines = [json.dumps(row) + "\n" for row in rows(ROWS)]
    path.write_text("".join(lines))
    size = path.stat().st_size
    share = sum(map(len, lines[:PROGRESS_ROWS])) / size

    with caplog.at_level(logging.INFO, logger="problems.loader"):
        problems, report = read_problems(path)

    assert len(problems) == report.rows == ROWS
    (line,) = progress_lines(caplog)
    assert 0.75 < share < 0.85  # the shorter rows come first
    assert line == (
        f"{path}: {PROGRESS_ROWS:,} rows read ({share:.0%} of {size / 1e6:.0f} MB), "
        f"{PROGRESS_ROWS:,} problems"
    )


def test_a_long_parquet_file_says_how_many_of_its_rows_are_read(tmp_path, caplog):
    path = tmp_path / "long.parquet"
    pq.write_table(pa.Table.from_pylist(rows(ROWS)), path)

    with caplog.at_level(logging.INFO, logger="problems.loader"):
        read_problems(path)

    assert progress_lines(caplog) == [
        f"{path}: {PROGRESS_ROWS:,} rows read (of {ROWS:,}), {PROGRESS_ROWS:,} problems"
    ]


def test_a_short_file_says_nothing_of_its_progress(tmp_path, caplog):
    path = tmp_path / "short.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows(1000)))

    with caplog.at_level(logging.INFO, logger="problems.loader"):
        read_problems(path)

    assert progress_lines(caplog) == []
