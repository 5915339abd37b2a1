"""Malformed rows of a real-data problem file: each kind is skipped and counted by reason, or,
with `data.files.bad_rows: refuse`, refused with the file, the line and the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from configs.data import DataConfig, FilesConfig
from problems.loader import ProblemFileError, read_problems
from stages import problems as problems_stage

GOOD = {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}
MAX_ROW_CHARS = 500

# (reason, the JSONL line): one of each kind of malformed row
BAD_LINES: list[tuple[str, bytes]] = [
    ("missing_answer", json.dumps({"question": "What is 1 + 1?"}).encode()),
    ("missing_answer", json.dumps({"question": "What is 1 + 2?", "answer": None}).encode()),
    ("missing_question", json.dumps({"answer": "#### 4"}).encode()),
    ("empty_question", json.dumps({"question": "   ", "answer": "#### 4"}).encode()),
    ("empty_answer", json.dumps({"question": "What is 2 + 2?", "answer": "#### "}).encode()),
    ("wrong_type", json.dumps({"question": ["What", "is"], "answer": "#### 4"}).encode()),
    ("wrong_type", json.dumps({"question": "What is 2 + 2?", "answer": {"v": 4}}).encode()),
    ("wrong_type", json.dumps({"question": "What is 2 + 2?", "answer": True}).encode()),
    ("wrong_type", json.dumps(GOOD | {"kind": "poem"}).encode()),
    ("wrong_type", json.dumps(GOOD | {"steps": "2 + 3 = 5"}).encode()),
    ("invalid_utf8", b'{"question": "What is 2 \xff\xfe 3?", "answer": "#### 5"}'),
    ("too_long", json.dumps({"question": "x" * MAX_ROW_CHARS, "answer": "#### 1"}).encode()),
    ("not_json", b'{"question": "What is 2 + 2?", "answer": '),
    ("not_an_object", b'["What is 2 + 2?", "4"]'),
]


def jsonl(tmp_path: Path, lines: list[bytes], name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def good_line(i: int) -> bytes:
    return json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}).encode()


def test_each_kind_of_bad_row_is_skipped_and_counted_by_reason(tmp_path):
    lines = [good_line(0)] + [line for _, line in BAD_LINES] + [b"", good_line(1)]
    path = jsonl(tmp_path, lines)
    problems, report = read_problems(path, bad_rows="skip", max_row_chars=MAX_ROW_CHARS)
    assert [p.answer for p in problems] == ["1", "2"]
    assert [p.id for p in problems] == ["data-000000", f"data-{len(BAD_LINES) + 1:06d}"]
    expected: dict[str, int] = {}
    for reason, _ in BAD_LINES:
        expected[reason] = expected.get(reason, 0) + 1
    assert report.skipped == expected
    assert (report.rows, report.loaded, report.n_skipped) == (len(BAD_LINES) + 2, 2, 14)
    assert report.first_skipped["missing_answer"] == "line 2"  # line 1 is the good row
    assert report.first_skipped["invalid_utf8"] == f"line {2 + 10}"


@pytest.mark.parametrize(("reason", "line"), BAD_LINES, ids=[r for r, _ in BAD_LINES])
def test_refuse_names_the_file_the_line_and_the_reason(tmp_path, reason, line):
    path = jsonl(tmp_path, [good_line(0), good_line(1), line])
    with pytest.raises(ProblemFileError) as err:
        read_problems(path, bad_rows="refuse", max_row_chars=MAX_ROW_CHARS)
    assert str(err.value).startswith(f"{path}:3: {reason}: ")


def test_a_number_answer_is_read_as_text(tmp_path):
    path = jsonl(tmp_path, [json.dumps({"question": "What is 6 * 7?", "answer": 42}).encode()])
    (problem,), report = read_problems(path, bad_rows="refuse")
    assert problem.answer == "42" and report.skipped == {}


def test_bad_parquet_rows_are_skipped_or_refused_by_row_number(tmp_path):
    path = tmp_path / "data.parquet"
    rows = [
        {"question": "What is 1 + 1?", "answer": "#### 2"},
        {"question": "What is 1 + 2?", "answer": None},
        {"question": "", "answer": "#### 3"},
        {"question": "y" * (MAX_ROW_CHARS + 1), "answer": "#### 4"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    problems, report = read_problems(path, bad_rows="skip", max_row_chars=MAX_ROW_CHARS)
    assert len(problems) == 1
    assert report.skipped == {"missing_answer": 1, "empty_question": 1, "too_long": 1}
    with pytest.raises(ProblemFileError, match=r"data\.parquet row 2: missing_answer: "):
        read_problems(path, bad_rows="refuse", max_row_chars=MAX_ROW_CHARS)


def test_a_file_with_no_usable_row_is_refused_even_when_skipping(tmp_path):
    path = jsonl(tmp_path, [line for _, line in BAD_LINES[:3]])
    with pytest.raises(ProblemFileError, match=r"no usable rows: .*skipped 3 of 3 rows"):
        read_problems(path, bad_rows="skip")


def files_config(tmp_path: Path, **settings) -> DataConfig:
    train = jsonl(tmp_path, [good_line(i) for i in range(3)] + [BAD_LINES[0][1]], "train.jsonl")
    heldout = jsonl(tmp_path, [good_line(10), BAD_LINES[10][1]], "heldout.jsonl")
    files = FilesConfig(train_path=train, heldout_path=heldout, **settings)
    return DataConfig(source="files", files=files, general=None)


def test_the_problems_stage_counts_skipped_rows_per_split(tmp_path):
    problems = problems_stage.run(files_config(tmp_path), tmp_path / "out")
    assert (problems.n_train, problems.n_heldout) == (3, 1)
    assert problems.skipped_rows == {"train/missing_answer": 1, "heldout/invalid_utf8": 1}
    assert problems_stage.skipped_row_metrics(problems) == {
        "data/skipped_rows/train": 1.0,
        "data/skipped_rows/heldout": 1.0,
        "data/skipped_rows/train/missing_answer": 1.0,
        "data/skipped_rows/heldout/invalid_utf8": 1.0,
    }


def test_the_problems_stage_refuses_when_told_to(tmp_path):
    with pytest.raises(ProblemFileError, match=r"train\.jsonl:4: missing_answer: "):
        problems_stage.run(files_config(tmp_path, bad_rows="refuse"), tmp_path / "out")
