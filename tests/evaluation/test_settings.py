"""Matching evaluations by settings, and what the verdict says when they differ: worked examples
of a few evaluations of `models:/r1-micro@final`, no store."""

from datetime import datetime

from configs.reinforcement import EvalConfig
from evaluation.settings import Difference, comparable, differences, evaluation_settings
from evaluation.verdict import judge, verdict_line, verdict_markdown
from storage.eval_history import Evaluation
from storage.model_registry import RegisteredModel

MODEL = RegisteredModel("r1-micro", "final", "3", "source-run", None, "d" * 64)
WATCHED = {"pass_at_1": 0.02, "general_score": 0.02}
DIGESTS = {"problems-heldout": "a" * 64, "general-eval_prompts": "b" * 64}


def settings(**changed) -> dict[str, str]:
    """The settings of the default evaluation config, scored by reward model `c...`, with
    `changed` config fields."""
    return evaluation_settings(EvalConfig(**changed), DIGESTS, "c" * 64, "e" * 64)


def evaluation(run_id: str, version: str, day: int, known: dict[str, str] | None, **metrics):
    at = datetime(2026, 11, day, 3)
    return Evaluation(at, "r1-micro", "final", version, "d", run_id, "src", metrics, known)


def test_the_settings_name_what_the_figures_measure():
    assert settings() == {
        "temperature": "0.7",
        "top_p": "0.95",
        "max_new_tokens": "160",
        "n_samples": "4",
        "k": "4",
        "seed": "0",
        "sampler": "hf",
        "max_problems": "100",
        "heldout_set": "aaaaaaaaaaaa",
        "general_prompts": "200",
        "general_set": "bbbbbbbbbbbb",
        "reward_model": "cccccccccccc",
        "verifiers": "eeeeeeeeeeee",
    }
    unscored = evaluation_settings(EvalConfig(), DIGESTS, None, "e" * 64)
    assert (unscored["general_prompts"], unscored["general_set"], unscored["reward_model"]) == (
        "none",
        "none",
        "none",
    )


def test_differences_name_each_setting_with_both_values():
    found = differences(settings(temperature=0.7), settings(temperature=3.0, top_p=0.9))
    assert found == [Difference("temperature", "0.7", "3.0"), Difference("top_p", "0.95", "0.9")]
    assert [d.line() for d in found] == ["temperature 0.7 -> 3.0", "top_p 0.95 -> 0.9"]
    assert differences({"seed": "0"}, {}) == [Difference("seed", "0", None)]
    assert Difference("seed", "0", None).line() == "seed 0 -> unset"


def test_only_known_settings_that_differ_in_general_ones_alone_are_comparable():
    assert comparable(settings(), settings())
    judge_changed = evaluation_settings(EvalConfig(), DIGESTS, "f" * 64, "e" * 64)
    assert comparable(settings(), judge_changed)
    assert not comparable(settings(), settings(temperature=3.0))
    assert not comparable(None, settings())  # recorded before settings were: unknown


def test_an_evaluation_at_another_temperature_gets_no_verdict_and_says_why():
    """The reported case: 3.0 against 0.7 was called a regression without a word."""
    earlier = [evaluation("cool", "2", 1, settings(), pass_at_1=0.65, general_score=1.0)]
    now = {"pass_at_1": 0.10, "general_score": 0.2}
    verdict = judge(MODEL, "hot", now, settings(temperature=3.0), earlier, WATCHED)
    assert verdict.regressions == [] and verdict.previous is None
    assert verdict.outcome == "settings-differ"
    assert verdict.summary()["settings_differ"] == ["temperature 0.7 -> 3.0"]
    assert verdict_line(verdict, WATCHED) == (
        "models:/r1-micro@final v3: no verdict, settings differ from v2's evaluation: "
        "temperature 0.7 -> 3.0 (pass_at_1 0.100, general_score 0.200)"
    )
    markdown = verdict_markdown(verdict, WATCHED, "sqlite:///m.db")
    assert "**No verdict**: no earlier evaluation of this alias has the same settings" in markdown
    assert "(MLflow run cool), differs in:\n- temperature 0.7 -> 3.0\n" in markdown
    assert "| pass_at_1 | 0.100 | - | - | 0.020 |" in markdown  # no figure set against 0.65
    assert "Regression" not in markdown and "Settings: temperature 3.0, top_p 0.95" in markdown


def test_the_latest_evaluation_with_the_same_settings_is_the_one_compared():
    earlier = [
        evaluation("hot", "2", 2, settings(temperature=3.0), pass_at_1=0.10),
        evaluation("cool", "2", 1, settings(), pass_at_1=0.65),
    ]
    verdict = judge(MODEL, "new", {"pass_at_1": 0.60}, settings(), earlier, WATCHED)
    assert verdict.previous is earlier[1] and verdict.passed_over == 1
    assert verdict.regressions == ["pass_at_1 fell from 0.650 to 0.600 (allowed drop 0.020)"]
    assert " v3 regressed against v2: pass_at_1 0.600 (was 0.650)" in verdict_line(verdict, WATCHED)
    markdown = verdict_markdown(verdict, WATCHED, "sqlite:///m.db")
    assert "1 later evaluation(s) with other settings passed over" in markdown


def test_an_evaluation_whose_settings_were_not_recorded_is_not_compared():
    earlier = [evaluation("old", "2", 1, None, pass_at_1=0.9)]
    verdict = judge(MODEL, "new", {"pass_at_1": 0.5}, settings(), earlier, WATCHED)
    assert verdict.regressions == [] and verdict.outcome == "settings-differ"
    assert verdict_line(verdict, WATCHED) == (
        "models:/r1-micro@final v3: no verdict, v2's evaluation recorded no settings "
        "(pass_at_1 0.500)"
    )
    markdown = verdict_markdown(verdict, WATCHED, "sqlite:///m.db")
    assert (
        "(MLflow run old), recorded no settings (it ran before settings were recorded)" in markdown
    )


def test_another_reward_model_sets_the_general_score_aside_and_pass_at_1_is_still_judged():
    earlier = [evaluation("cool", "2", 1, settings(), pass_at_1=0.65, general_score=1.0)]
    rejudged = evaluation_settings(EvalConfig(), DIGESTS, "f" * 64, "e" * 64)
    now = {"pass_at_1": 0.64, "general_score": 0.1}
    verdict = judge(MODEL, "new", now, rejudged, earlier, WATCHED)
    assert verdict.previous is earlier[0] and verdict.regressions == []
    assert verdict.set_aside == ["general_score"]
    assert verdict_line(verdict, WATCHED) == (
        "models:/r1-micro@final v3 held against v2: pass_at_1 0.640 (was 0.650); a drop over "
        "0.020 fails; general_score not compared (reward_model cccccccccccc -> ffffffffffff)"
    )
    worse = judge(
        MODEL, "new", {"pass_at_1": 0.5, "general_score": 0.1}, rejudged, earlier, WATCHED
    )
    assert worse.regressions == ["pass_at_1 fell from 0.650 to 0.500 (allowed drop 0.020)"]


def test_the_same_settings_are_judged_as_before():
    earlier = [evaluation("cool", "2", 1, settings(), pass_at_1=0.65)]
    verdict = judge(MODEL, "new", {"pass_at_1": 0.64}, settings(), earlier, WATCHED)
    assert verdict.outcome == "ok" and verdict.passed_over == 0 and verdict.set_aside == []
    assert judge(MODEL, "new", {"pass_at_1": 0.64}, settings(), [], WATCHED).unlike is None
