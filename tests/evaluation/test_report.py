"""The per-stage report and stage 7's size check."""

import pytest

from evaluation.report import (
    LINE_WIDTH,
    StageRow,
    html_table,
    markdown_table,
    plot_stages,
    stage_lines,
    table_dict,
)
from models.saved import ModelRef
from stages.distill import check_smaller

ROWS = [
    StageRow(
        "bootstrap",
        10.0,
        {
            "pass_at_1": 0.1,
            "pass_at_1_lenient": 0.8,
            "math/pass_at_1_lenient": 0.9,
            "logic/pass_at_1_lenient": 0.7,
            "pass_at_4_lenient": 0.3,
            "format_rate": 0.0,
        },
    ),
    StageRow("cold_start_curation", 2.0, {}, "kept 5/9"),
    StageRow("mixed_sft", 5.0, {"pass_at_1_lenient": 0.6, "general_score": 1.25}),
    StageRow("all_scenarios_rl", 6.0, {"general_score": 1.5, "general_score_sem": 0.04}),
]


def test_markdown_table_has_a_row_per_stage_and_dashes_for_missing_figures():
    lines = markdown_table(ROWS, k=4).splitlines()
    assert lines[0].startswith(
        "| stage | time | pass@1 | strict | math | code | logic | pass@4 | cons@4 | format |"
    )
    assert lines[2] == (
        "| bootstrap | 10s | 0.800 | 0.100 | 0.900 | - | 0.700 | 0.300 | - | 0.000 | - | - |  |"
    )
    assert lines[3].endswith("| - | - | - | - | - | - | - | - | - | - | kept 5/9 |")
    assert "| 0.600 |" in lines[4] and "| 1.250 |" in lines[4]
    assert "| 1.500 ± 0.040 |" in lines[5]
    assert "strict" in lines[-1] and "lenient" in lines[-1]  # the legend says which is which


def test_table_dict_is_column_major_with_the_markdown_tables_cells():
    table = table_dict(ROWS, k=4)
    assert table["stage"] == ["bootstrap", "cold_start_curation", "mixed_sft", "all_scenarios_rl"]
    assert table["time"] == ["10s", "2s", "5s", "6s"]
    assert table["pass@1"] == ["0.800", "-", "0.600", "-"]
    assert table["strict"] == ["0.100", "-", "-", "-"]
    assert table["general score"] == ["-", "-", "1.250", "1.500 ± 0.040"]
    assert table["notes"] == ["", "kept 5/9", "", ""]


def test_plot_is_written(tmp_path):
    path = plot_stages(ROWS, 4, tmp_path / "plot.png")
    assert path.stat().st_size > 1000


def test_a_student_must_be_smaller_than_its_teacher():
    check_smaller(ModelRef("s", 10), ModelRef("t", 20), "qwen")
    with pytest.raises(ValueError, match="not fewer than the teacher"):
        check_smaller(ModelRef("s", 20), ModelRef("t", 20), "qwen")


def test_html_table_has_every_cell_escaped():
    rows = ROWS + [StageRow("x<script>", 1.0, {}, "a & b")]
    page = html_table(rows, k=4)
    assert page.count("<tr>") == len(rows) + 1
    assert '<td class="n">1.500 ± 0.040</td>' in page
    assert "x&lt;script&gt;" in page and "a &amp; b" in page and "<script>" not in page


def test_a_line_a_stage_fits_80_columns_under_a_logs_prefix():
    """The longest stage names, a four-digit time and long notes: each line within LINE_WIDTH
    (80 columns less `--watch`'s 28), the figures of a model, the notes of the rest."""
    rows = [
        *ROWS,
        StageRow("student_base_llama", 1234.0, {}, "cached from run 7a72dbd5, params 0.70M, v11"),
        StageRow("rejection_sampling", 64.0, {}, "data 25 general, 8 reasoning, kept 2199/4400"),
    ]
    lines = stage_lines(rows)
    assert LINE_WIDTH + 28 <= 80 and all(len(line) <= LINE_WIDTH for line in lines), lines
    assert lines[0] == "bootstrap             10s  pass@1 0.800 format 0.000"
    assert lines[1] == "cold_start_curation    2s  kept 5/9"
    assert lines[3] == "all_scenarios_rl       6s"  # no pass@1: its general score is in the table
    assert lines[4] == "student_base_llama  1234s  params 0.70M, v11"  # no "cached from"
    assert lines[5].startswith("rejection_sampling    64s  data 25 general")
    assert lines[5].endswith("…")


def test_a_stages_held_out_figures_fit_log_lines_under_watch():
    """Every figure the report has, with standard errors, a few a line: at 80 columns under
    `--watch` the one line of 206 characters wrapped into three."""
    from evaluation.report import LINE_WIDTH, columns, figure_lines

    metrics = {key: 0.123 for _, key in columns(4)} | {"general_score": -0.249}
    metrics |= {f"{key}_sem": 0.004 for _, key in columns(4)}
    lines = figure_lines(metrics, 4)
    assert all(len(line) <= LINE_WIDTH for line in lines), lines
    said = ", ".join(lines)
    assert said.startswith("pass@1 0.123 ± 0.004, strict 0.123 ± 0.004")
    assert said.count(" ± ") == len(columns(4)) and "general score -0.249 ± 0.004" in said
    assert figure_lines({"pass_at_1_lenient": 0.5}, 4) == ["pass@1 0.500"]


def test_a_stage_whose_guard_tripped_says_so_under_its_figures():
    """The short report keeps a model's figures on its line and, under it, what its guard did
    when it warned, stopped or rolled back; `guard clean` says nothing more."""
    warned = "pass@1 0.78->0.80, guard warned (gamed_term@65), not registered as @reasoning-rl, v5"
    rows = [
        StageRow("reasoning_rl", 190.0, {"pass_at_1_lenient": 0.8}, warned),
        StageRow("r1_zero_rl", 46.0, {"pass_at_1_lenient": 0.7}, "guard clean, model v3"),
        StageRow("all_scenarios_rl", 53.0, {"pass_at_1_lenient": 0.8},
                 "pass@1 0.79->0.79, guard rolled back 1x, clean (after collapse@30), model v7"),
    ]  # fmt: skip
    lines = stage_lines(rows)
    assert lines[0].startswith("reasoning_rl      190s  pass@1 0.800")
    assert lines[1:3] == ["  guard warned (gamed_term@65)", "  not registered as @reasoning-rl"]
    assert lines[3].startswith("r1_zero_rl")
    assert lines[5] == "  guard rolled back 1x, clean (after collapse@30)" and len(lines) == 6
    assert all(len(line) <= LINE_WIDTH for line in lines)
