"""One loader for every problem file: the tiny world's own and real data sets.

Real data: JSONL, a JSON array of objects, or Parquet with a question and an answer column
(names configurable). Answers
may be GSM8K solutions ending in `#### 42` or MATH solutions with `\\boxed{42}`; the final answer
is extracted at load so every stage sees a clean gold string, and a worked solution is kept whole
as `Problem.solution` (cold-start curation can learn from it).

A row that cannot become a problem (see REASONS) is either refused, with the file, the line and
the reason, or skipped and counted by reason in a LoadReport (`data.files.bad_rows`). The
pipeline's own files are read strictly: `load_problems` refuses.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow.parquet as pq

from problems.answers import final_answer_text, worked_solution
from problems.scripts import dominant_script, is_script
from problems.types import FAMILIES, Problem

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".json", ".parquet")
KINDS = ("reasoning", "general")
DEFAULT_MAX_ROW_CHARS = 20_000

BadRowPolicy = Literal["skip", "refuse"]

# Why a row was not loaded, in the order the checks run.
REASONS = (
    "invalid_utf8",  # a JSONL line that is not valid UTF-8
    "not_json",  # a JSONL line that does not parse
    "not_an_object",  # JSON that is not an object ({...})
    "missing_question",  # no question column, or null
    "missing_answer",  # no answer column, or null
    "wrong_type",  # e.g. a list where text is expected (a finite number answer is read as text)
    "too_long",  # the text the loader reads (question, answer, solution, tests) over max_row_chars
    "empty_question",  # only whitespace
    "empty_answer",  # a reasoning problem whose final answer is empty
)
# A JSONL line longer than this is not parsed at all (16 MiB, or 6 bytes a character of
# max_row_chars, JSON's longest escape `\\uXXXX`, where that is more): a row is measured by the
# text the loader reads, and a line this long is not worth parsing to find it.
_LINE_MAX_BYTES = 1 << 24
_LINE_BYTES_PER_CHAR = 6
_JSON_ARRAY_MAX_BYTES = 1 << 30  # a JSON array is read whole; JSONL and Parquet are streamed
# A file this long says how far it has read every PROGRESS_ROWS rows: NuminaMath's 860,000 rows
# take minutes to read and check, and said nothing until the last.
PROGRESS_ROWS = 100_000
# A keyword every program `_is_program` looks for holds: a definition or an import.
_PROGRAM_KEYWORD = re.compile(r"\b(?:def|class|import)\b")


class ProblemFileError(ValueError):
    """A problem file is missing, of an unknown kind, lacks the expected columns, or holds a row
    that cannot be loaded."""


class BadRow(ValueError):
    """One row that cannot become a problem: `reason` (one of REASONS) and what is wrong."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass
class LoadReport:
    """What loading one file did: rows read, problems loaded, and rows skipped by reason."""

    path: Path
    rows: int = 0  # rows read; blank JSONL lines are not rows
    loaded: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows
    first_skipped: dict[str, str] = field(default_factory=dict)  # reason -> where, e.g. "line 7"

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())

    def count(self, where: str, bad: BadRow) -> None:
        self.skipped[bad.reason] = self.skipped.get(bad.reason, 0) + 1
        self.first_skipped.setdefault(bad.reason, where)

    def summary(self) -> str:
        parts = [
            f"{reason} {n} (first at {self.first_skipped[reason]})"
            for reason, n in sorted(self.skipped.items(), key=lambda item: REASONS.index(item[0]))
        ]
        return f"{self.path}: skipped {self.n_skipped} of {self.rows} rows: {', '.join(parts)}"


@dataclass(frozen=True)
class RawRow:
    where: str  # for messages: "line 3" (JSONL), "item 3" (a JSON array), "row 3" (Parquet)
    index: int  # position among the file's rows, from 0: names a row without an id
    row: dict[str, Any] | BadRow
    read: str  # how far into the file the row ends: "12% of 1.5 GB", "of 860,000" (rows)


def _jsonl_rows(path: Path, max_row_chars: int) -> Iterator[RawRow]:
    index, consumed, size = -1, 0, path.stat().st_size
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            consumed += len(raw)
            if not raw.strip():
                continue
            index += 1
            read = _share_read(consumed, size)
            yield RawRow(f"line {lineno}", index, _parse_line(raw, max_row_chars), read)


def _share_read(consumed: int, size: int) -> str:
    """`12% of 1.5 GB`: how far into a file of `size` bytes `consumed` bytes reach."""
    whole = f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.0f} MB"
    return f"{consumed / max(size, 1):.0%} of {whole}"


def _log_progress(path: Path, rows: int, read: str, loaded: int) -> None:
    """One line on how far a long file's read has come (every PROGRESS_ROWS rows)."""
    log.info("%s: %s rows read (%s), %s problems", path, f"{rows:,}", read, f"{loaded:,}")


def _parse_line(raw: bytes, max_row_chars: int) -> dict[str, Any] | BadRow:
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark opens line 1
    except UnicodeDecodeError as err:
        return BadRow("invalid_utf8", f"byte {err.start} of the line is not valid UTF-8")
    if len(raw) > max(_LINE_MAX_BYTES, _LINE_BYTES_PER_CHAR * max_row_chars):
        return BadRow("too_long", f"a line of {len(raw)} bytes, not read")
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        return BadRow("not_json", f"not JSON ({err.msg})")
    return _object(row)


def _object(row: object) -> dict[str, Any] | BadRow:
    if not isinstance(row, dict):
        return BadRow("not_an_object", f"a JSON {type(row).__name__}, not an object")
    return row


def _starts_array(path: Path) -> bool:
    """Whether a .json file holds one JSON array (`[{...}, ...]`) rather than JSON lines."""
    with path.open("rb") as f:
        head = f.read(4096).removeprefix(b"\xef\xbb\xbf").lstrip()
    return head.startswith(b"[")


def _array_rows(path: Path) -> Iterator[RawRow]:
    size = path.stat().st_size
    if size > _JSON_ARRAY_MAX_BYTES:
        raise ProblemFileError(
            f"{path}: a JSON array of {size} bytes is read whole; write it as JSONL (one object "
            "a line) or Parquet, which are read a row at a time"
        )
    try:
        items = json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as err:
        raise ProblemFileError(f"{path}: byte {err.start} is not valid UTF-8") from None
    except json.JSONDecodeError as err:
        raise ProblemFileError(
            f"{path}:{err.lineno}: not JSON ({err.msg}): a .json file is one JSON array of "
            "objects or JSON lines"
        ) from None
    if not isinstance(items, list):
        raise ProblemFileError(f"{path}: a JSON {type(items).__name__}, not an array of objects")
    for index, item in enumerate(items):
        yield RawRow(f"item {index + 1}", index, _object(item), f"of {len(items):,}")


def _parquet_rows(path: Path) -> Iterator[RawRow]:
    index, parquet = 0, pq.ParquetFile(path)
    total = parquet.metadata.num_rows
    for batch in parquet.iter_batches(batch_size=1024):  # `limit` reads no further
        for row in batch.to_pylist():
            yield RawRow(f"row {index + 1}", index, row, f"of {total:,}")
            index += 1


def _raw_rows(path: Path, max_row_chars: int) -> Iterator[RawRow]:
    if not path.exists():
        raise ProblemFileError(f"{path}: no such file")
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    if path.suffix == ".json" and _starts_array(path):
        return _array_rows(path)
    if path.suffix in (".jsonl", ".json"):
        return _jsonl_rows(path, max_row_chars)
    raise ProblemFileError(f"{path}: unknown file kind; expected one of {SUFFIXES}")


def _text(row: dict[str, Any], name: str, numbers: bool = False) -> str | None:
    """Column `name` as text, None when absent or null; a number is text only if `numbers`."""
    value = row.get(name)
    if value is None or isinstance(value, str):
        return value
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise BadRow("wrong_type", f"{name!r} is {value}, not a number an answer can be")
        return str(value)
    raise BadRow("wrong_type", f"{name!r} is a {type(value).__name__}, not text")


def _problem(
    row: dict[str, Any], index: int, path: Path, fields: tuple[str, ...], max_row_chars: int
) -> Problem:
    """The problem in `row`, or BadRow naming why there is none. Only the columns read count
    towards `max_row_chars`: a data set's other columns (NuminaMath's `messages`) do not. A code
    problem (one with tests) needs no answer: its tests judge it."""
    question_field, answer_field, tests_field = fields
    tests = _tests(row, tests_field)
    required = (question_field,) if tests else (question_field, answer_field)
    missing = [f for f in required if row.get(f) is None]
    if missing:
        reason = "missing_question" if question_field in missing else "missing_answer"
        raise BadRow(reason, f"row lacks column(s) {missing}; has {sorted(row)}")
    question = _text(row, question_field)
    solution = _text(row, answer_field, numbers=True) or ""
    kind = _text(row, "kind") or "reasoning"
    if kind not in KINDS:
        raise BadRow("wrong_type", f"'kind' is {kind!r}, not one of {list(KINDS)}")
    row_id, key = (_text(row, name, numbers=True) for name in ("id", "key"))
    language, source = _text(row, "language"), _text(row, "source")
    steps = row.get("steps") or ()
    if not isinstance(steps, list | tuple) or not all(isinstance(s, str) for s in steps):
        raise BadRow("wrong_type", "'steps' is not a list of text")
    assert question is not None  # checked as missing above
    given = _text(row, "solution")  # our own files keep it apart from the clean answer
    numbers = _numbers(row)
    chars = sum(map(len, (question, solution, given or "", *tests)))
    if chars > max_row_chars:
        raise BadRow("too_long", f"{chars} characters of text, over {max_row_chars}")
    if not question.strip():
        raise BadRow("empty_question", f"{question_field!r} is empty")
    family = _text(row, "family") or ("code" if tests else "logic" if numbers else "math")
    if family not in FAMILIES:
        raise BadRow("wrong_type", f"'family' is {family!r}, not one of {list(FAMILIES)}")
    if family == "code" and not tests:
        raise BadRow("missing_answer", f"a code problem has no {tests_field!r} to judge it by")
    if family == "logic" and not numbers:
        raise BadRow("missing_answer", "a logic problem has no 'numbers' to reach it from")
    if kind == "reasoning" and family == "math" and _is_program(solution):
        raise BadRow(
            "missing_answer",
            f"{answer_field!r} is a program, and a code problem is judged by its tests: name "
            f"their column (data.files.tests_field; {tests_field!r} is not in the row)",
        )
    answer = final_answer_text(solution)
    if kind == "reasoning" and not answer and family != "code":
        raise BadRow("empty_answer", f"{answer_field!r} holds no final answer")
    default_id = f"{path.stem}-{index:06d}"
    return Problem(
        id=row_id or default_id,
        question=question,
        answer=answer,
        language=_script(language, question),
        source=source or path.name,
        key=key or row_id or default_id,
        steps=tuple(steps),
        kind=kind,
        solution=worked_solution(given or solution),
        family=family,
        tests=tests,
        numbers=numbers,
    )


def _script(language: str | None, question: str) -> str:
    """The script the question's answers should be written in: a `language` column naming one
    ("latin", "cjk"), else the question's own; a language's code ("en", "zh") names no script,
    and the language rewards measure scripts."""
    given = (language or "").strip().lower()
    return given if is_script(given) else dominant_script(question)


def _tests(row: dict[str, Any], name: str = "tests") -> tuple[str, ...]:
    """A code problem's tests from column `name`, each as text: assert statements (MBPP's
    `test_list`, or one text of statements), or stdin/stdout cases (a list of `{"input",
    "output"}`, each as such or as JSON text, or APPS's `{"inputs": [...], "outputs": [...]}`, as
    such or as JSON text), each case kept as its JSON. An assert-style test must be Python and
    assert something outside any function it defines: HumanEval's `def check(candidate)` alone
    asserts nothing."""
    tests = row.get(name)
    if tests is None:
        return ()
    if isinstance(tests, str):
        decoded = _json_or_none(tests)
        tests = decoded if isinstance(decoded, dict | list) else [tests]
    if isinstance(tests, dict):
        tests = _io_cases(tests, name)
    if not isinstance(tests, list | tuple):
        raise BadRow("wrong_type", f"{name!r} is a {type(tests).__name__}, not a list of tests")
    kept = []
    for i, test in enumerate(tests, 1):
        test = _case_or_test(test)
        if isinstance(test, dict):
            kept.append(json.dumps(_io_case(test, f"{name!r} case {i}")))
        elif not isinstance(test, str):
            raise BadRow("wrong_type", f"{name!r} test {i} is a {type(test).__name__}")
        elif test.strip():
            _check_asserts(test, f"{name!r} test {i}")
            kept.append(test)
    return tuple(kept)


def _case_or_test(test: Any) -> Any:
    """One test as given, or a stdin/stdout case written as JSON text (`{"input": ..., "output":
    ...}`): how the prepared files keep each case, and no assert statement is a JSON object."""
    if isinstance(test, str):
        decoded = _json_or_none(test)
        if isinstance(decoded, dict):
            return decoded
    return test


def _json_or_none(text: str) -> Any:
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _io_cases(cases: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """APPS's `{"inputs": [...], "outputs": [...]}` as one case a pair."""
    if cases.get("fn_name"):
        raise BadRow("wrong_type", f"{name!r} calls a function by name (fn_name): not supported")
    inputs, outputs = cases.get("inputs"), cases.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise BadRow("wrong_type", f"{name!r} is not inputs and outputs of one length")
    return [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]


def _io_case(case: dict[str, Any], where: str) -> dict[str, str]:
    texts = [case.get("input"), case.get("output")]
    if not all(isinstance(text, str) for text in texts):
        raise BadRow("wrong_type", f"{where} is not an 'input' and an 'output' of text")
    return {"input": texts[0], "output": texts[1]}


def _check_asserts(test: str, where: str) -> None:
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError) as err:
        raise BadRow("wrong_type", f"{where} is not Python ({err})") from None
    if not any(isinstance(node, ast.Assert) for node in _outside_definitions(tree)):
        raise BadRow(
            "wrong_type",
            f"{where} asserts nothing outside the functions it defines (HumanEval's `def "
            "check(candidate)` is never called): write its asserts calling the function by name",
        )


def _outside_definitions(tree: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `tree` that run when it runs: not the bodies of functions or classes."""
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
    for node in ast.iter_child_nodes(tree):
        yield node
        if not isinstance(node, definitions):
            yield from _outside_definitions(node)


def _is_program(text: str) -> bool:
    """Whether an answer is a program (defines a function or class, or imports), not an answer.
    Text without one of those keywords is none, and is not parsed: parsing every worked
    solution of a large data set took a quarter of its load."""
    if not _PROGRAM_KEYWORD.search(text):
        return False
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    return any(isinstance(node, kinds) for node in tree.body)


def _numbers(row: dict[str, Any]) -> tuple[int, ...]:
    numbers = row.get("numbers")
    if numbers is None:
        return ()
    ok = isinstance(numbers, list | tuple) and all(
        isinstance(n, int) and not isinstance(n, bool) for n in numbers
    )
    if not ok:
        raise BadRow("wrong_type", "'numbers' is not a list of whole numbers")
    return tuple(numbers)


def _refusal(path: Path, where: str, bad: BadRow) -> ProblemFileError:
    """`file:line: reason: detail` for JSONL, `file row n: reason: detail` for Parquet (`item n`
    for a JSON array)."""
    place = (
        f"{path}:{where.removeprefix('line ')}" if where.startswith("line ") else f"{path} {where}"
    )
    return ProblemFileError(f"{place}: {bad.reason}: {bad.detail}")


def read_problems(
    path: str | Path,
    question_field: str = "question",
    answer_field: str = "answer",
    limit: int | None = None,
    bad_rows: BadRowPolicy = "refuse",
    max_row_chars: int = DEFAULT_MAX_ROW_CHARS,
    tests_field: str = "tests",
) -> tuple[list[Problem], LoadReport]:
    """Read problems from `path`, extracting each final answer from its solution text.

    A malformed row (REASONS) raises ProblemFileError naming the file, the line (JSONL) or row
    (Parquet) and the reason, or with `bad_rows="skip"` is skipped and counted in the report; a
    file of which no row could be loaded is refused either way.
    """
    path = Path(path)
    report = LoadReport(path)
    problems: list[Problem] = []
    for raw in _raw_rows(path, max_row_chars):
        if limit is not None and len(problems) >= limit:
            break
        report.rows += 1
        try:
            if isinstance(raw.row, BadRow):
                raise raw.row
            fields = (question_field, answer_field, tests_field)
            problems.append(_problem(raw.row, raw.index, path, fields, max_row_chars))
        except BadRow as bad:
            if bad_rows == "refuse":
                raise _refusal(path, raw.where, bad) from None
            report.count(raw.where, bad)
        if report.rows % PROGRESS_ROWS == 0:
            _log_progress(path, report.rows, raw.read, len(problems))
    report.loaded = len(problems)
    if report.skipped:
        if not problems:
            raise ProblemFileError(f"no usable rows: {report.summary()}")
        log.warning("%s", report.summary())
    return problems, report


def load_problems(
    path: str | Path,
    question_field: str = "question",
    answer_field: str = "answer",
    limit: int | None = None,
) -> list[Problem]:
    """Read problems from `path`, refusing any malformed row (see `read_problems`)."""
    return read_problems(path, question_field, answer_field, limit)[0]


def write_problems(path: str | Path, problems: list[Problem]) -> Path:
    """Write problems as JSONL, the form `load_problems` reads back unchanged."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps(p.to_dict(), ensure_ascii=False) + "\n")
    return path
