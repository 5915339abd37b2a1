"""The tables printed at the end of a pipeline run."""

from __future__ import annotations

from rich.table import Table

from evaluation.report import cell
from evaluation.report import columns as report_columns
from tasks.pipeline import PipelineResult


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
