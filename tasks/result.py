"""What a flow of the recipe returns. Apart from the stages' code on purpose: every flow names it
in its signature, and `prefect deploy` imports the flow modules for their signatures alone
(flows/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evaluation.report import StageRow


@dataclass(frozen=True)
class PipelineResult:
    """The flow's MLflow parent run and Prefect flow run, its state folder, the per-stage table
    and the rejection funnel's counts."""

    parent_run_id: str
    flow_run_id: str
    state_root: str
    rows: list[StageRow]
    filter_counts: dict[str, int]
