"""The tables printed at the end of a pipeline run: the whole per-stage table on a terminal
wide enough to hold it, else a line a stage (its row would wrap into three at 80 columns)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from evaluation.report import cell, stage_lines
from evaluation.report import columns as report_columns
from tasks.result import PipelineResult

WIDE = 180  # columns the whole table needs


def print_report(console: Console, result: PipelineResult, k: int) -> None:
    """The per-stage figures at the terminal's width; where the rest is."""
    if console.width >= WIDE:
        console.print(stage_table(result, k))
    else:
        console.print("held-out, after each stage:", highlight=False)
        console.print("\n".join(stage_lines(result.rows)), highlight=False)
        console.print(
            f"every figure: at {WIDE} columns, or the MLflow run's report/stages.html (below)",
            highlight=False,
        )
    if result.filter_counts:
        console.print(filter_table(result.filter_counts))


def stage_table(result: PipelineResult, k: int) -> Table:
    table = Table(title="R1 pipeline: held-out evaluation after each stage")
    table.add_column("stage")
    table.add_column("stage time", justify="right")
    columns = report_columns(k)
    for title, _ in columns:
        table.add_column(title, justify="right")
    table.add_column("notes")
    for row in result.rows:
        cells = [cell(row.metrics, key) for _, key in columns]
        table.add_row(row.stage, f"{row.seconds:.0f}s", *cells, row.note)
    return table


def filter_table(counts: dict[str, int]) -> Table:
    table = Table(title="curation filters: traces removed, in order")
    for name in counts:
        table.add_column(name, justify="right")
    table.add_row(*(str(n) for n in counts.values()))
    return table
