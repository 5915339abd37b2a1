"""Real data from scratch: GSM8K-format files through the whole micro pipeline (tokenizer and
corpus from the data's own worked solutions, cold start curated from them), and the combinations
of data and settings that cannot run refused up front, each naming its fix."""

import json
import random
from pathlib import Path

import pytest

from cli.main import main
from configs import load_profile
from problems.corpus import build_corpus
from problems.fit import data_fit_problems
from problems.loader import load_problems
from stages.bootstrap import tokenizer_texts


def gsm8k_rows(n: int, seed: int, solutions: bool = True) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, c = rng.randint(2, 30), rng.randint(2, 30), rng.randint(2, 5)
        total = (a + b) * c
        worked = (
            f"She had {a}+{b} = <<{a}+{b}={a + b}>>{a + b} clips.\n"
            f"Times {c} is {a + b}*{c} = <<{a + b}*{c}={total}>>{total} clips.\n"
        )
        answer = (worked if solutions else "") + f"#### {total}"
        question = f"Natalia had {a} clips and got {b} more, then {c} times as many. How many?"
        rows.append({"question": question, "answer": answer})
    return rows


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gsm8k")
    files = {}
    for name, n, seed, solutions in (
        ("train", 80, 0, True),
        ("heldout", 12, 1, True),
        ("bare", 20, 2, False),
    ):
        files[name] = folder / f"{name}.jsonl"
        files[name].write_text(
            "".join(json.dumps(r) + "\n" for r in gsm8k_rows(n, seed, solutions))
        )
    return files


def settings(data: dict[str, Path], train: str = "train", curation: str = "solutions") -> list[str]:
    return [
        "data.source=files",
        f"data.files.train_path={data[train]}",
        f"data.files.heldout_path={data['heldout']}",
        f"curation.source={curation}",
    ]


def test_the_corpus_and_tokenizer_texts_come_from_the_datas_own_solutions(data):
    problems = load_problems(data["train"])
    config = load_profile("micro", settings(data))
    docs = build_corpus(problems, config.bootstrap.corpus, seed=0)
    steps = [d for d in docs if d.style == "steps"]
    assert steps and all("<<" not in d.response and "####" not in d.response for d in docs)
    assert any("She had" in d.response and "The answer is" in d.response for d in steps)
    texts = tokenizer_texts(docs, problems, seed=0)
    assert any(t.startswith("<think> She had") for t in texts)


@pytest.mark.parametrize(
    ("train", "curation", "fix"),
    [
        ("train", "teacher", "set curation.source=solutions"),
        ("bare", "solutions", "give data with solutions"),
    ],
)
def test_combinations_that_cannot_run_are_refused_naming_the_fix(
    data, capsys, train, curation, fix
):
    config = load_profile("micro", settings(data, train, curation))
    assert any(fix in reason for reason in data_fit_problems(config))
    args = ["config", "--profile", "micro"] + [
        a for s in settings(data, train, curation) for a in ("--set", s)
    ]
    assert main(args) == 2
    assert fix in capsys.readouterr().err


def code_rows(n: int) -> list[dict]:
    """Stdin/stdout code problems as a data set ships them: tests, a program, no worked steps."""
    return [
        {
            "question": f"Read x and print x plus {k}.",
            "answer": f"print(int(input()) + {k})",
            "tests": [{"input": "1\n", "output": f"{1 + k}\n"}],
        }
        for k in range(n)
    ]


def test_a_code_data_sets_problems_are_not_traced_as_the_tiny_worlds(data, tmp_path):
    """The programmatic teacher knows only the tiny world's functions (their operations are
    its steps): a data set's code problems are refused it up front, and the corpus of a data
    set mixing them with worked solutions answers them from their own programs."""
    code = tmp_path / "code.jsonl"
    code.write_text("".join(json.dumps(r) + "\n" for r in code_rows(40)))
    only_code = ["data.source=files", f"data.files.train_path={code}"]
    only_code += [f"data.files.heldout_path={code}", "curation.source=teacher"]

    reasons = data_fit_problems(load_profile("micro", only_code))

    assert any("set curation.source=solutions" in reason for reason in reasons), reasons
    assert any("bootstrap.path" in reason for reason in reasons), reasons
    mixed = load_problems(data["train"]) + load_problems(code)
    docs = build_corpus(mixed, load_profile("micro").bootstrap.corpus, seed=0)
    assert any("print(int(input()) + 3)" in d.response for d in docs)


def test_bare_answers_from_scratch_need_a_checkpoint(data):
    config = load_profile("micro", settings(data, "bare", "solutions"))
    reasons = data_fit_problems(config, "r1_zero")
    assert len(reasons) == 1 and "bootstrap.path" in reasons[0]
    assert data_fit_problems(load_profile("micro", settings(data))) == []
    assert data_fit_problems(load_profile("micro")) == []  # the tiny world


@pytest.mark.heavy
def test_gsm8k_files_run_through_every_stage_from_scratch(data, tmp_path, monkeypatch):
    from tests.prefect_harness import prefect_harness

    monkeypatch.setenv("R1_STATE_DIR", str(tmp_path / "state"))
    from flows.r1_pipeline import r1_pipeline

    with prefect_harness():
        result = r1_pipeline(profile="micro", overrides=settings(data))
    stages = [row.stage for row in result.rows]
    assert stages[0] == "bootstrap" and "all_scenarios_rl" in stages and "rl_only_llama" in stages
    assert result.filter_counts.get("no_solution", 0) == 0
