import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from configs.data import MathWorld, WorldConfig
from configs.supervised import CorpusConfig
from problems.corpus import build_corpus
from problems.generators import evaluate, expression, worked_steps
from problems.loader import ProblemFileError, load_problems, write_problems
from problems.scripts import dominant_script, to_script
from problems.world import split_world

WORLD = WorldConfig(seed=3, math=MathWorld(n_train=600, n_heldout=100))


def test_train_and_heldout_are_disjoint_by_problem_and_by_text():
    train, heldout = split_world(WORLD)
    assert len(train) == 600 and len(heldout) == 100
    assert not {p.key for p in train} & {p.key for p in heldout}
    assert not {p.question for p in train} & {p.question for p in heldout}
    assert len({p.id for p in train + heldout}) == 700


def test_world_is_reproducible_from_its_seed():
    assert split_world(WORLD) == split_world(WORLD)
    assert split_world(WORLD) != split_world(WORLD.model_copy(update={"seed": 4}))


def test_answers_follow_the_worked_steps():
    train, _ = split_world(WORLD)
    for p in train:
        assert p.steps[-1].endswith(f"= {p.answer}")
        assert int(p.answer) >= 0


def test_expression_respects_precedence():
    ops = [("+", 5), ("*", 2), ("-", 3)]
    text = expression(7, ops)
    assert text == "(7 + 5) * 2 - 3"
    assert eval(text) == evaluate(7, ops) == 21  # noqa: S307 - our own arithmetic string
    assert worked_steps(7, ops) == ["7 + 5 = 12", "12 * 2 = 24", "24 - 3 = 21"]


def test_second_script_is_used_and_detected():
    train, _ = split_world(WORLD)
    greek = [p for p in train if p.language == "greek"]
    assert 0.15 < len(greek) / len(train) < 0.45
    assert all(dominant_script(p.question) == "greek" for p in greek)
    assert to_script("Add 5.", "greek") == "Αδδ 5."


def test_corpus_mixes_styles_and_scripts():
    train, _ = split_world(WORLD)
    docs = build_corpus(train, CorpusConfig(), seed=0)
    styles = {d.style for d in docs}
    assert styles == {"direct", "steps", "mixed", "formatted"}
    formatted = [d for d in docs if d.style == "formatted"]
    assert 0 < len(formatted) < 0.1 * len(docs)
    assert any(not d.correct for d in docs)


def test_drill_documents_hold_true_facts_in_the_problems_ranges():
    train, _ = split_world(WORLD)
    docs = build_corpus(train, CorpusConfig(fact_docs=50, facts_per_doc=6), seed=0)
    drills = [d for d in docs if d.style == "drill"]
    assert len(drills) == 50 and len(docs) == 50 + 2 * len(train)
    facts = [f.strip() for d in drills for f in d.response.split(".") if f.strip()]
    assert len(facts) == 300
    steps = [s for p in train for s in p.steps]
    for fact in facts:
        lhs, result = fact.split(" = ")
        assert eval(lhs) == int(result)  # noqa: S307 - our own arithmetic string
        left, op, right = lhs.split()
        same_op = [s.split()[2] for s in steps if s.split()[1] == op]
        assert op in "+-*" and int(right) <= max(int(r) for r in same_op)
        assert op != "-" or int(result) >= 0


def test_loader_reads_gsm8k_jsonl(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    rows = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
        {"question": "What is 6 times 7?", "answer": "6 * 7 = 42.\n#### 42"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    problems = load_problems(path)
    assert [p.answer for p in problems] == ["7", "42"]
    assert problems[0].language == "latin"
    assert problems[0].id == "gsm8k-000000"


def test_loader_reads_math_parquet_with_other_column_names(tmp_path):
    path = tmp_path / "math.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"problem": "1/2 + 0?", "solution": r"It is $\boxed{\frac12}$."}]),
        path,
    )
    problems = load_problems(path, question_field="problem", answer_field="solution")
    assert problems[0].answer == r"\frac12"


def test_tiny_world_round_trips_through_the_same_loader(tmp_path):
    train, _ = split_world(WORLD)
    assert load_problems(write_problems(tmp_path / "train.jsonl", train)) == train


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(ProblemFileError, match="no such file"):
        load_problems(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.csv"
    bad.write_text("q,a\n")
    with pytest.raises(ProblemFileError, match="unknown file kind"):
        load_problems(bad)
    cols = tmp_path / "cols.jsonl"
    cols.write_text(json.dumps({"prompt": "x", "answer": "1"}) + "\n")
    with pytest.raises(ProblemFileError, match=r"lacks column\(s\) \['question'\]"):
        load_problems(cols)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "x", "answer": "1"}\n{oops\n')
    with pytest.raises(ProblemFileError, match="broken.jsonl:2"):
        load_problems(broken)
