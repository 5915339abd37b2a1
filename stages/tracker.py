"""What a stage may report while it runs; the task passes in an MLflow-backed tracker."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Tracker(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...


class NullTracker:
    """Records nothing: for tests and for running a stage by hand."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        return None

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        return None
