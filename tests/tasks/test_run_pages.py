"""The first lines of a run's MLflow page: worked examples."""

from evaluation.report import StageRow
from tasks.run_pages import curve_keys, curves_summary, headline, report_description

ROWS = [
    StageRow("bootstrap", 300.0, {"pass_at_1_lenient": 0.709}),
    StageRow("cold_start_curation", 3.0, {}, "kept 5/9"),
    StageRow("all_scenarios_rl", 48.0, {"pass_at_1_lenient": 0.817}),
    StageRow("student_qwen", 26.0, {"pass_at_1_lenient": 0.379}),
]


def test_the_headline_names_the_final_model_and_the_base():
    assert headline(ROWS, 1260.0) == (
        "final model (all_scenarios_rl): pass@1 0.817, base (bootstrap) 0.709 · 4 stages, 21 min "
        "of stage time"
    )
    assert headline(ROWS[1:2], 60.0) == "1 stages, 1 min of stage time"


def test_the_report_description_starts_with_links_to_the_table_and_the_chart():
    text = report_description("3", "abc", ROWS, "| table |")
    first = text.splitlines()[0]
    assert "[the table](#/experiments/3/runs/abc/artifacts/report/stages.html?workflowType" in first
    assert "[bar chart](#/experiments/3/runs/abc/artifacts/report/stages.png?workflowType" in first
    assert text.endswith("| table |")


def test_the_curves_are_reward_families_length_and_kl():
    keys = [
        "loss",
        "reward/std",
        "reward/mean",
        "reward/family/math/mean",
        "kl",
        "reward/family/code/mean",
        "completion/mean_tokens",
        "eval/pass_at_1",
    ]
    assert curve_keys(keys) == [
        "completion/mean_tokens",
        "kl",
        "reward/mean",
        "reward/family/code/mean",
        "reward/family/math/mean",
    ]


def test_the_summary_gives_each_curve_from_its_first_to_its_last_tenth():
    history = [
        {
            "step": float(s),
            "reward/mean": s / 10,
            "reward/family/math/mean": s / 5,
            "completion/mean_tokens": 50.0 + s,
        }
        for s in range(1, 21)
    ]
    # 20 steps: each end is the mean of two points
    assert curves_summary(history) == (
        "20 steps: reward 0.15 → 1.95 · length 52 → 70 tokens  \nper family: math 0.30 → 3.90"
    )
