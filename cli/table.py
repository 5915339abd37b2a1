"""The tables printed at the end of a pipeline run."""

from __future__ import annotations

from rich.table import Table

from tasks.pipeline import PipelineResult


def _columns(k: int) -> list[tuple[str, str]]:
    return [
        ("pass@1", "pass_at_1"),
        (f"pass@{k}", f"pass_at_{k}"),
        (f"cons@{k}", f"cons_at_{k}"),
        ("format", "format_rate"),
        ("lang. consistent", "language_consistency_rate"),
    ]


def stage_table(result: PipelineResult, k: int) -> Table:
    table = Table(title="R1 pipeline: held-out evaluation after each stage")
    table.add_column("stage")
    table.add_column("stage time", justify="right")
    columns = _columns(k)
    for title, _ in columns:
        table.add_column(title, justify="right")
    table.add_column("notes")
    for row in result.rows:
        cells = [f"{row.metrics[key]:.3f}" if key in row.metrics else "-" for _, key in columns]
        table.add_row(row.stage, f"{row.seconds:.0f}s", *cells, row.note)
    return table


def filter_table(counts: dict[str, int]) -> Table:
    table = Table(title="curation filters: traces removed, in order")
    for name in counts:
        table.add_column(name, justify="right")
    table.add_row(*(str(n) for n in counts.values()))
    return table
