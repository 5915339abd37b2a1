"""Graders declared in YAML (OpenAI's grader keys) and their use as rewards."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from configs.reinforcement import RewardTerm
from graders import GraderFileError, load_grader, load_spec, make_sample, passed
from graders.build import build_grader
from graders.formula import Formula, FormulaError, compile_formula, evaluate
from graders.python_grader import PythonGrader
from graders.reward import grader_reward
from graders.score_model import clip, parse_score
from graders.similarity import bleu, fuzzy_match, gleu, lcs_length, rouge_l, rouge_n
from graders.spec import parse_spec
from graders.string_check import string_check
from graders.templates import TemplateError, references, render
from rewards.registry import RewardSet, get_reward, known_rewards

EXAMPLES = Path(__file__).resolve().parents[2] / "graders" / "examples"


def write(tmp_path: Path, grader: dict, name: str = "grader.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(grader, sort_keys=False))
    return path


def grade(grader, completions: list[str], items: list[dict]) -> list[float | None]:
    outcomes = grader.evaluate([make_sample(c) for c in completions], items)
    return [o.score for o in outcomes]


# --- string_check ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "operation,text,reference,expected",
    [
        ("eq", "Paris", "Paris", 1.0),
        ("eq", "Paris", "paris", 0.0),
        ("eq", "Paris ", "Paris", 0.0),  # no trimming
        ("ne", "Paris", "Rome", 1.0),
        ("ne", "Paris", "Paris", 0.0),
        ("like", "The capital is Paris.", "Paris", 1.0),  # the input contains the reference
        ("like", "The capital is paris.", "Paris", 0.0),  # case-sensitive
        ("like", "Paris", "The capital is Paris.", 0.0),  # not the other way round
        ("ilike", "THE CAPITAL IS PARIS.", "paris", 1.0),
        ("ilike", "Lyon", "paris", 0.0),
    ],
)
def test_string_check_operations(operation, text, reference, expected):
    assert string_check(operation, text, reference) == expected


def test_string_check_grader_reads_answer_block_and_gold():
    grader = load_grader(EXAMPLES / "exact_answer.yaml")
    scores = grade(
        grader,
        [
            "<think> 6*7 </think> <answer> 42 </answer>",
            "<answer>41</answer>",
            "<answer>42</answer>",
        ],
        [{"answer": "42"}, {"answer": "42"}, {"answer": 42}],  # a number renders as its JSON
    )
    assert scores == [1.0, 0.0, 1.0]
    # a bare "42" is no answer: answer_text is only the answer block
    assert grade(grader, ["42"], [{"answer": "42"}]) == [0.0]


# --- text similarity metrics, against hand-computed values -----------------------------------

CAT, CAT_REF = "the cat sat on the mat", "the cat is on the mat"


def test_bleu_worked_example():
    # 1-grams 5/6, 2-grams 3/5, 3-grams 1/4, 4-grams 0/3 -> smoothed 1/(2*3); equal lengths, BP 1
    assert bleu(CAT, CAT_REF) == pytest.approx((5 / 6 * 3 / 5 * 1 / 4 * 1 / 6) ** 0.25)
    assert bleu(CAT, CAT_REF) == pytest.approx(0.379918, abs=1e-6)
    assert bleu(CAT_REF, CAT_REF) == pytest.approx(1.0)
    # too short: orders 1 and 2 only, both exact; brevity penalty exp(1 - 6/2)
    assert bleu("the cat", CAT_REF) == pytest.approx(math.exp(-2))
    assert bleu("", CAT_REF) == 0.0


def test_gleu_worked_example():
    # matches 5+3+1+0 = 9 over max(18, 18) n-grams
    assert gleu(CAT, CAT_REF) == pytest.approx(0.5)
    assert gleu("the cat", CAT_REF) == pytest.approx(3 / 18)


def test_rouge_worked_examples():
    # Lin (2004): reference "police killed the gunman", candidate "the gunman kill police"
    ref, cand = "police killed the gunman", "the gunman kill police"
    assert lcs_length(cand.split(), ref.split()) == 2
    assert rouge_l(cand, ref) == pytest.approx(0.5)
    assert rouge_l("police kill the gunman", ref) == pytest.approx(0.75)
    assert rouge_n(cand, ref, 1) == pytest.approx(0.75)  # police, the, gunman of 4 and 4
    assert rouge_n(cand, ref, 2) == pytest.approx(1 / 3)  # "the gunman" of 3 and 3
    assert rouge_n(CAT, CAT_REF, 1) == pytest.approx(5 / 6)
    assert rouge_n(CAT, CAT_REF, 2) == pytest.approx(3 / 5)
    assert rouge_n("The Cat", "the cat", 2) == 1.0  # lower-cased
    assert rouge_n("a b", "a b", 3) == 0.0  # no trigram on either side


def test_fuzzy_match():
    assert fuzzy_match("kitten", "sitting") == pytest.approx(2 * 4 / 13)  # "ittn" shared
    assert fuzzy_match("abc", "abc") == 1.0
    assert fuzzy_match("", "") == 1.0
    assert fuzzy_match("abc", "") == 0.0


def test_text_similarity_grader_and_threshold(tmp_path):
    grader = load_grader(EXAMPLES / "answer_overlap.yaml")
    scores = grade(
        grader,
        ["<answer> police kill the gunman </answer>", "<answer> nothing alike </answer>"],
        [{"answer": "police killed the gunman"}] * 2,
    )
    assert scores == [pytest.approx(0.75), 0.0]
    assert passed(grader, scores[0]) is True and passed(grader, scores[1]) is False


@pytest.mark.parametrize("metric", ["cosine", "meteor"])
def test_unsupported_metrics_are_refused_naming_grader_and_metric(tmp_path, metric):
    path = write(
        tmp_path,
        {
            "type": "text_similarity",
            "name": "close_enough",
            "input": "{{sample.output_text}}",
            "reference": "{{item.answer}}",
            "evaluation_metric": metric,
        },
    )
    with pytest.raises(GraderFileError) as error:
        load_grader(path)
    message = str(error.value)
    assert str(path) in message and "evaluation_metric" in message
    assert "'close_enough'" in message and f"'{metric}'" in message and "not supported" in message


# --- templates ------------------------------------------------------------------------------


def test_templates_render_nested_fields_lists_and_json():
    sample = make_sample('{"answer": {"value": 7}}')
    item = {"meta": {"tags": ["a", "b"], "n": 3}, "gold": "x"}
    template = "{{item.meta.tags[1]}}|{{ item.meta.tags.0 }}|{{item.meta.n}}|{{item.meta}}|"
    assert render(template, sample, item) == 'b|a|3|{"tags": ["a", "b"], "n": 3}|'
    assert render("{{sample.output_json.answer.value}}", sample, item) == "7"
    assert render("no references", sample, item) == "no references"


def test_sample_namespace():
    sample = make_sample("<think> t </think> <answer> 12 </answer>")
    assert sample["output_text"] == "<think> t </think> <answer> 12 </answer>"
    assert sample["answer_text"] == "12"
    assert sample["output_json"] is None
    assert make_sample("  plain ")["answer_text"] == ""  # no answer block, no answer
    assert make_sample("<answer> 1 </answer> <answer> 2 </answer>")["answer_text"] == ""


@pytest.mark.parametrize(
    "template,fragment",
    [
        ("{{items.answer}}", "namespace 'items' is unknown"),
        ("{{item}}", "name a field"),
        ("{{sample.output_tools}}", "sample.output_tools is not supported"),
        ("{{sample.output_text.x}}", "sample.output_text is text"),
        ("{{item.a b}}", "cannot read the path"),
    ],
)
def test_bad_references_are_found_at_load_time(template, fragment):
    with pytest.raises(TemplateError, match=fragment):
        references(template)


def test_bad_reference_in_a_file_names_the_key(tmp_path):
    path = write(
        tmp_path,
        {
            "type": "string_check",
            "name": "s",
            "operation": "eq",
            "input": "{{sample.output_txt}}",
            "reference": "x",
        },
    )
    with pytest.raises(GraderFileError, match=r"grader\.yaml: input: .*sample\.output_txt"):
        load_grader(path)


def test_missing_item_field_scores_none_with_the_reference_named():
    grader = load_grader(EXAMPLES / "exact_answer.yaml")
    outcomes = grader.evaluate([make_sample("42")] * 3, [{"gold": "42"}, {"answer": None}, {}])
    assert [o.score for o in outcomes] == [None, None, None]
    assert "item has no 'answer'" in outcomes[0].error and "'gold'" in outcomes[0].error
    assert "item.answer is empty" in outcomes[1].error


# --- multi and its formula ------------------------------------------------------------------


def checked(text: str, names: tuple[str, ...] = ("a", "b")) -> Formula:
    return compile_formula(text, names)


def test_formula_arithmetic_and_functions():
    assert evaluate(checked("(a + b) / 2"), {"a": 1, "b": 0}) == 0.5
    assert evaluate(checked("a ^ 2 + b ** 2"), {"a": 3, "b": 4}) == 25.0
    assert evaluate(checked("2 * a ^ 2"), {"a": 3, "b": 0}) == 18.0  # ^ is a power, binds first
    formula = checked("max(a, b) - min(a, b) + abs(-1) + sqrt(4) + floor(0.5) + ceil(0.5)")
    assert evaluate(formula, {"a": 1, "b": 3}) == 2 + 1 + 2 + 0 + 1
    assert evaluate(checked("log(exp(a))"), {"a": 2.0}) == pytest.approx(2.0)
    assert checked("0.5 * a").names == {"a"}


@pytest.mark.parametrize(
    "formula,fragment",
    [
        ("__import__('os')", "calling '__import__' is not allowed"),
        ("__import__('os').system('true')", "attribute access '.system' is not allowed"),
        ("a.__class__", "attribute access '.__class__' is not allowed"),
        ("(lambda: 1)()", "is not allowed"),
        ("(lambda: 1)", "a lambda is not allowed"),
        ("open('x')", "calling 'open' is not allowed"),
        ("[a for a in (1,)]", "ListComp expression is not allowed"),
        ("a[0]", "Subscript expression is not allowed"),
        ("'text'", "constant 'text' is not a number"),
        ("max(a, key=b)", "plain positional arguments"),
        ("a if b else 1", "IfExp expression is not allowed"),
        ("a < b", "Compare expression is not allowed"),
        ("a // b", "operator FloorDiv is not allowed"),
        ("c + 1", "unknown name 'c'"),
        ("sqrt(a, b)", "takes one argument"),
        ("a +", "not valid arithmetic"),
        ("a" + " + a" * 400, "at most 1000"),
    ],
)
def test_hostile_or_unknown_formulas_are_refused(formula, fragment):
    with pytest.raises(FormulaError, match="formula") as error:
        checked(formula)
    assert fragment in str(error.value)


def test_formula_errors_at_grading_time_are_formula_errors():
    with pytest.raises(FormulaError, match="failed"):
        evaluate(checked("a / b"), {"a": 1, "b": 0})
    with pytest.raises(FormulaError, match="failed"):
        evaluate(checked("log(a)"), {"a": 0})
    with pytest.raises(FormulaError):
        evaluate(checked("exp(a) ^ 1000"), {"a": 50})


def test_multi_grader_combines_and_gives_none_when_a_part_cannot_score():
    grader = load_grader(EXAMPLES / "format_and_answer.yaml")
    scores = grade(
        grader,
        [
            "<think> 6*7 </think> <answer> 42 </answer>",  # right and formatted
            "<answer> 42 </answer>",  # right, no think block
            "<think> x </think> <answer> 41 </answer>",  # wrong, formatted
            "<answer> 42 </answer>",  # no gold answer
        ],
        [{"answer": "42"}, {"answer": "42"}, {"answer": "42"}, {}],
    )
    assert scores == [1.0, pytest.approx(0.8), pytest.approx(0.2), None]


def test_multi_division_by_zero_scores_none(tmp_path):
    check = {"type": "string_check", "name": "c", "operation": "eq", "input": "a", "reference": "b"}
    path = write(
        tmp_path, {"type": "multi", "name": "m", "graders": {"c": check}, "calculate_output": "1/c"}
    )
    outcome = load_grader(path).evaluate([make_sample("x")], [{}])[0]
    assert outcome.score is None and "failed" in outcome.error


def test_hostile_formula_in_a_file_names_the_key(tmp_path):
    check = {"type": "string_check", "name": "c", "operation": "eq", "input": "a", "reference": "a"}
    path = write(
        tmp_path,
        {
            "type": "multi",
            "name": "m",
            "graders": {"c": check},
            "calculate_output": "__import__('os')",
        },
    )
    with pytest.raises(GraderFileError, match=r"calculate_output: .*'__import__' is not allowed"):
        load_grader(path)


# --- python graders in the sandbox ----------------------------------------------------------


def python_grader(tmp_path: Path, source: str, seconds: float = 2.0):
    path = write(tmp_path, {"type": "python", "name": "py", "source": source})
    return load_grader(path, python_seconds=seconds)


def test_python_grader_runs_grade_in_the_sandbox():
    grader = load_grader(EXAMPLES / "numeric_close.yaml")
    scores = grade(
        grader,
        ["<answer> 42 </answer>", "<answer> 40 </answer>", "<answer> none </answer>"],
        [{"answer": "42"}] * 3,
    )
    assert scores == [1.0, pytest.approx(0.5 - 2 / 84), 0.0]


def test_python_grader_failures_score_zero_with_the_reason_and_spare_the_others(tmp_path):
    source = (
        "def grade(sample, item):\n"
        "    print('chatter on stdout')\n"
        "    mode = item['mode']\n"
        "    if mode == 'raise':\n"
        "        raise RuntimeError('bad sample')\n"
        "    if mode == 'loop':\n"
        "        while True:\n"
        "            pass\n"
        "    if mode == 'text':\n"
        "        return 'high'\n"
        "    if mode == 'nan':\n"
        "        return float('nan')\n"
        "    return 0.25\n"
    )
    grader = python_grader(tmp_path, source, seconds=0.5)
    modes = ["ok", "raise", "loop", "text", "nan", "ok"]
    outcomes = grader.evaluate([make_sample("x")] * len(modes), [{"mode": m} for m in modes])
    # a sample that breaks its grading gets no benefit of the doubt: 0, with the reason
    assert [o.score for o in outcomes] == [0.25, 0.0, 0.0, 0.0, 0.0, 0.25]
    assert "RuntimeError: bad sample" in outcomes[1].error
    assert "limit" in outcomes[2].error  # the CPU or the wall clock, whichever comes first
    assert "not a number" in outcomes[3].error
    assert "nan" in outcomes[4].error and outcomes[0].error is None


def test_python_grader_that_cannot_start_is_refused_when_it_loads_and_scores_none(tmp_path):
    source = "import no_such_module\n\ndef grade(sample, item):\n    return 1"
    path = write(tmp_path, {"type": "python", "name": "py", "source": source})
    with pytest.raises(GraderFileError, match=r"source: cannot run in the sandbox.*no_such_module"):
        load_grader(path)
    grader = PythonGrader(load_spec(path))  # one that stops starting mid-run scores nothing
    outcomes = grader.evaluate([make_sample("x")] * 2, [{}, {}])
    assert [o.score for o in outcomes] == [None, None]
    assert "no_such_module" in outcomes[0].error


@pytest.mark.parametrize(
    "source,fragment",
    [
        ("def grade(sample, item)\n    return 1", "source: does not parse"),
        ("def score(sample, item):\n    return 1", "source: defines no top-level function grade"),
        ("def grade(sample):\n    return 1", "source: grade() must take two arguments"),
    ],
)
def test_bad_python_source_names_the_key(tmp_path, source, fragment):
    path = write(tmp_path, {"type": "python", "name": "py", "source": source})
    with pytest.raises(GraderFileError, match=re.escape(fragment)):
        load_grader(path)


# --- score model ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply,expected",
    [
        ('{"result": 7, "steps": []}', 7.0),
        ('I think so. {"score": 0.5}', 0.5),
        ("Reasoning: 3 of 4 steps hold.\nScore: 6.5", 6.5),
        ("rating = 2", 2.0),
        ("the answer looks fine\n  8 ", 8.0),
        ("score: 3, then on reflection score: 4", 4.0),
        ("no number here", None),
        ("5 apples and 3 pears", None),  # a number in prose is not a score
        ("", None),
        ('{"result": "high"}', None),
    ],
)
def test_parse_score(reply, expected):
    assert parse_score(reply) == expected


def test_clip():
    assert clip(12.0, (0, 10)) == 10 and clip(-1.0, (0, 10)) == 0 and clip(3.0, (0, 10)) == 3


def test_score_model_with_a_stand_in_judge_parses_and_clips():
    seen = []

    def judge(conversations, params):
        seen.extend(conversations)
        assert params.max_completions_tokens == 16
        return ["score: 7", "Score: 14", "I cannot say"]

    grader = load_grader(EXAMPLES / "judged_answer.yaml", judge=judge)
    scores = grade(
        grader,
        ["<answer> 42 </answer>"] * 3,
        [{"answer": "42", "prompt": f"q{i}"} for i in range(3)],
    )
    assert scores == [7.0, 10.0, 0.0]  # 14 clipped to range [0, 10]; no number -> the bottom
    assert seen[0][0]["role"] == "system"
    assert "Question: q0\nReference answer: 42\nCandidate answer: 42" in seen[0][1]["content"]


def test_score_model_judge_failures_score_none():
    def broken(conversations, params):
        raise RuntimeError("out of memory")

    grader = load_grader(EXAMPLES / "judged_answer.yaml", judge=broken)
    outcomes = grader.evaluate([make_sample("x")], [{"answer": "1", "prompt": "q"}])
    assert outcomes[0].score is None and "out of memory" in outcomes[0].error
    short = load_grader(EXAMPLES / "judged_answer.yaml", judge=lambda c, p: [])
    assert short.evaluate([make_sample("x")], [{"answer": "1", "prompt": "q"}])[0].score is None
    # a sample whose template cannot be filled is not sent to the judge
    grader = load_grader(EXAMPLES / "judged_answer.yaml", judge=lambda c, p: ["score: 1"] * len(c))
    assert grade(grader, ["a", "b"], [{"prompt": "q"}, {"answer": "1", "prompt": "q"}]) == [
        None,
        1.0,
    ]


def test_score_model_runs_a_real_tiny_model(tmp_path):
    from tests.tiny_models import make_tokenizer, tiny_model

    tokenizer = make_tokenizer()
    model = tiny_model(tokenizer)
    folder = tmp_path / "judge"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    spec = yaml.safe_load((EXAMPLES / "judged_answer.yaml").read_text())
    spec["model"] = str(folder)
    spec["sampling_params"] = {"temperature": 0.8, "seed": 0, "max_completions_tokens": 6}
    grader = load_grader(write(tmp_path, spec))
    outcomes = grader.evaluate(
        [make_sample("<answer> 3 </answer>"), make_sample("<answer> 5 </answer>")],
        [{"answer": "3", "prompt": "What is 1 + 2?"}] * 2,
    )
    # an untrained judge: its reply is noise, so either no score or one inside the range; but it
    # did reply (a failure to load or generate would read "judge failed")
    for outcome in outcomes:
        assert outcome.score is None or 0.0 <= outcome.score <= 10.0
        assert outcome.error is None or outcome.error.startswith("no score in the judge's reply")


# --- the registry hook and bad files --------------------------------------------------------


def test_registry_builds_a_grader_reward_from_a_yaml_path(monkeypatch, tmp_path):
    assert "grader" in known_rewards()
    monkeypatch.chdir(tmp_path)  # a repo-relative path still resolves
    term = RewardTerm(name="grader", params={"path": "graders/examples/exact_answer.yaml"})
    rewards = RewardSet.from_terms([term])
    fn = rewards.fns["grader"]
    assert fn.__name__ == "grader"
    scores = fn(
        ["p1", "p2", "p3"],
        ["<think> a </think> <answer> 7 </answer>", "<answer> 8 </answer>", "7"],
        answer=["7", "7", "7"],
        language=["en"] * 3,
        kind=["reasoning"] * 3,
        completion_tokens=[5, 5, 5],
    )
    assert scores == [1.0, 0.0, 0.0]


def test_prompt_and_columns_become_the_item(tmp_path):
    path = write(
        tmp_path,
        {
            "type": "string_check",
            "name": "s",
            "operation": "like",
            "input": "{{sample.output_text}}",
            "reference": "{{item.prompt}}/{{item.kind}}",
        },
    )
    reward = get_reward("grader", path=str(path))
    assert reward(["q"], ["echo q/general"], kind=["general"]) == [1.0]


def test_grading_never_raises_on_malformed_input():
    reward = grader_reward(str(EXAMPLES / "format_and_answer.yaml"))
    # columns shorter than the completions: nothing can be matched up, so nothing is scored
    assert reward(["p", "p"], ["a", "b"], answer=["1"]) == [None, None]
    assert reward([], [], answer=[]) == []
    assert reward(["p"], ["<answer> 1 </answer>"], answer=[["not", "text"]]) == [pytest.approx(0)]


@pytest.mark.parametrize(
    "grader,fragment",
    [
        (
            {
                "type": "string_check",
                "name": "s",
                "operation": "contains",
                "input": "a",
                "reference": "b",
            },
            "operation: Input should be 'eq', 'ne', 'like' or 'ilike'",
        ),
        (
            {"type": "string_check", "name": "s", "operation": "eq", "input": "a"},
            "reference: Field required",
        ),
        (
            {
                "type": "string_check",
                "name": "s",
                "operation": "eq",
                "input": "a",
                "reference": "b",
                "threshold": 1,
            },
            "threshold: unknown key",
        ),
        ({"type": "label_model", "name": "l"}, "type: 'label_model' is not supported"),
        ({"type": "regex", "name": "r"}, "type: 'regex' is not a grader type"),
        (
            {
                "type": "score_model",
                "name": "j",
                "model": "/nowhere/judge",
                "input": [{"role": "user", "content": "{{sample.output_text}}"}],
            },
            "model: '/nowhere/judge' is not a local model folder",
        ),
        (
            {
                "type": "score_model",
                "name": "j",
                "model": "/x",
                "range": [1, 0],
                "input": [{"role": "user", "content": "hi"}],
            },
            "range: range [1.0, 0.0] is empty",
        ),
        (
            {
                "type": "multi",
                "name": "m",
                "calculate_output": "a",
                "graders": {
                    "a": {
                        "type": "string_check",
                        "name": "a",
                        "operation": "like",
                        "input": "x",
                        "reference": "{{item.gold[x]}}",
                    }
                },
            },
            "graders.a.reference: template reference",
        ),
        (
            {
                "type": "multi",
                "name": "m",
                "calculate_output": "1",
                "graders": {
                    "max": {
                        "type": "string_check",
                        "name": "a",
                        "operation": "eq",
                        "input": "x",
                        "reference": "y",
                    }
                },
            },
            "graders.max: a grader's key must be a plain name",
        ),
    ],
)
def test_bad_grader_files_fail_at_registry_time_naming_file_and_key(tmp_path, grader, fragment):
    path = write(tmp_path, grader, "bad.yaml")
    with pytest.raises(GraderFileError) as error:
        RewardSet.from_terms([RewardTerm(name="grader", params={"path": str(path)})])
    message = str(error.value)
    assert message.startswith(f"{path}: ")
    assert fragment in message


def test_unreadable_files_and_params_are_named(tmp_path):
    with pytest.raises(GraderFileError, match="missing.yaml: cannot read"):
        get_reward("grader", path=str(tmp_path / "missing.yaml"))
    broken = tmp_path / "broken.yaml"
    broken.write_text("type: [string_check\n")
    with pytest.raises(GraderFileError, match="broken.yaml: not valid YAML"):
        get_reward("grader", path=str(broken))
    with pytest.raises(GraderFileError, match="needs params.path"):
        get_reward("grader")
    with pytest.raises(GraderFileError, match=r"unknown params \['file'\]"):
        get_reward("grader", file="x.yaml")


def test_openai_json_file_loads_unchanged(tmp_path):
    path = tmp_path / "grader.json"
    path.write_text(
        '{"type": "text_similarity", "name": "sim", "input": "{{ sample.output_text }}",'
        ' "reference": "{{ item.reference_answer }}", "evaluation_metric": "bleu",'
        ' "pass_threshold": 0.6}'
    )
    grader = load_grader(path)
    assert grade(grader, [CAT], [{"reference_answer": CAT_REF}]) == [pytest.approx(0.379918, 1e-5)]
    assert load_spec(path) == parse_spec(yaml.safe_load(path.read_text()), "x")
    assert build_grader(load_spec(path)).name == "sim"
