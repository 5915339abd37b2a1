"""The per-stage table printed at the end of a pipeline run."""

from __future__ import annotations

from rich.table import Table

from tasks.pipeline import PipelineResult

_COLUMNS = [
    ("pass@1", "pass_at_1"),
    ("pass@k", "pass_at_"),
    ("cons@k", "cons_at_"),
    ("format", "format_rate"),
    ("lang. consistent", "language_consistency_rate"),
]


def _metric(metrics: dict[str, float], prefix: str) -> str:
    for key, value in metrics.items():
        if key == prefix or (prefix.endswith("_") and key.startswith(prefix)):
            return f"{value:.3f}"
    return "-"


def filter_table(counts: dict[str, int]) -> Table:
    table = Table(title="cold-start curation: traces removed by each filter, in order")
    for name in counts:
        table.add_column(name, justify="right")
    table.add_row(*(str(n) for n in counts.values()))
    return table


def stage_table(result: PipelineResult) -> Table:
    k = next((key.rsplit("_", 1)[1] for r in result.rows for key in r.metrics if key.startswith("pass_at_") and key != "pass_at_1"), "k")
    table = Table(title=f"R1 pipeline: held-out evaluation after each stage (k={k})")
    table.add_column("stage")
    table.add_column("stage time", justify="right")
    for title, _ in _COLUMNS:
        table.add_column(title, justify="right")
    table.add_column("notes")
    for row in result.rows:
        table.add_row(
            row.stage,
            f"{row.seconds:.0f}s",
            *(_metric(row.metrics, prefix) for _, prefix in _COLUMNS),
            row.note,
        )
    return table
