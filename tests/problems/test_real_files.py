"""Real data files as data sets ship them: a byte-order mark, a JSON array, Parquet read a batch
at a time, columns the loader does not read, a `language` column of language codes, an answer
that is not a number."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from configs.data import DataConfig, FilesConfig
from configs.profiles import load_profile
from problems.loader import ProblemFileError, read_problems
from training.memory_fit import CHARS_PER_TOKEN, TEMPLATE_TOKENS, longest_prompt_tokens

ROWS = [
    {"question": "Natalia sold 48 clips in April and half as many in May. How many?",
     "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\n#### 72"},
    {"question": "What is 1,000 + 600?", "answer": "1000 + 600 = 1600\n#### 1,600"},
]  # fmt: skip


def test_a_byte_order_mark_does_not_cost_the_first_row(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(r) for r in ROWS).encode() + b"\r\n")
    problems, report = read_problems(path, bad_rows="skip")
    assert [p.answer for p in problems] == ["72", "1600"] and report.skipped == {}


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
def test_a_json_array_of_objects_is_read_as_its_items(tmp_path, indent, bom):
    path = tmp_path / "data.json"
    path.write_bytes(bom + json.dumps(ROWS, indent=indent).encode())
    problems, _ = read_problems(path)
    assert [p.answer for p in problems] == ["72", "1600"]
    assert [p.id for p in problems] == ["data-000000", "data-000001"]


def test_a_json_array_names_its_bad_item_and_a_broken_one_its_line(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps([ROWS[0], {"question": "q?"}, "text"], indent=2))
    with pytest.raises(ProblemFileError, match=r"data\.json item 2: missing_answer: "):
        read_problems(path)
    problems, report = read_problems(path, bad_rows="skip")
    assert len(problems) == 1 and report.skipped == {"missing_answer": 1, "not_an_object": 1}
    assert report.first_skipped == {"missing_answer": "item 2", "not_an_object": "item 3"}
    path.write_text('[\n  {"question": "q?", "answer": "#### 1"},\n  {"question": \n')
    with pytest.raises(ProblemFileError, match=r"data\.json:4: not JSON \(.*\): a \.json file"):
        read_problems(path)
    path.write_text('{"question": "q?", "answer": "#### 1"}\n{"question": "r?", "answer": "2"}')
    assert [p.answer for p in read_problems(path)[0]] == ["1", "2"]  # JSON lines in a .json


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_an_answer_that_is_no_number_is_refused(tmp_path, value):
    path = tmp_path / "data.jsonl"
    path.write_text(f'{{"question": "What is 0/0?", "answer": {value}}}\n')
    with pytest.raises(ProblemFileError, match=r"data\.jsonl:1: wrong_type: 'answer' is"):
        read_problems(path)


def test_only_the_text_read_counts_towards_the_longest_row(tmp_path):
    """A JSONL line's escapes (`\\u4e2d` for one character) and columns the loader never reads
    (NuminaMath's `messages`) do not make a row too long; the same rows in Parquet agree."""
    question = "中" * 300 + "？"
    rows = [
        {
            "question": question,
            "answer": "#### 3",
            "solution": "",
            "messages": [{"content": "x" * 2000}],
        },  # fmt: skip
        {"question": "q" * 450, "answer": "#### 4", "solution": "s" * 100},  # 556 > 500
    ]
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))  # ASCII: 6 bytes a character
    parquet = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    for path in (jsonl, parquet):
        problems, report = read_problems(path, bad_rows="skip", max_row_chars=500)
        assert [p.question for p in problems] == [question], path
        assert report.skipped == {"too_long": 1}, path


def test_a_language_code_is_no_script_so_the_question_tells(tmp_path):
    chinese = "小明有3个苹果，又买了5个。他现在有几个？"
    rows = [
        {"question": chinese, "answer": "#### 8", "language": "zh"},
        {"question": "How many apples?", "answer": "#### 8", "language": "en"},
        {"question": "How many apples?", "answer": "#### 8", "language": "Greek"},
    ]  # fmt: skip
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    assert [p.language for p in read_problems(path)[0]] == ["cjk", "latin", "greek"]


def test_parquet_is_read_no_further_than_the_limit(tmp_path, monkeypatch):
    path = tmp_path / "data.parquet"
    rows = [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(5000)]
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1000)
    reads = []
    real = pq.ParquetFile.iter_batches

    def counted(self, *args, **kwargs):
        for batch in real(self, *args, **kwargs):
            reads.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted)
    problems, _ = read_problems(path, limit=10)
    assert len(problems) == 10 and sum(reads) <= 1024


@pytest.mark.parametrize("kind", ["jsonl with a blank line", "parquet", "json array"])
def test_the_memory_preflight_finds_the_longest_question_in_any_file(tmp_path, kind):
    rows = [ROWS[0], ROWS[1] | {"question": "How many? " * 90}]
    train = tmp_path / {"parquet": "t.parquet", "json array": "t.json"}.get(kind, "t.jsonl")
    if kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), train)
    elif kind == "json array":
        train.write_text(json.dumps(rows))
    else:
        train.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")
    files = FilesConfig(train_path=train, heldout_path=train)
    data = DataConfig(source="files", files=files, general=None)
    config = load_profile("micro").model_copy(update={"data": data})
    expected = math.ceil(len(rows[1]["question"]) / CHARS_PER_TOKEN) + TEMPLATE_TOKENS
    assert longest_prompt_tokens(config) == expected
