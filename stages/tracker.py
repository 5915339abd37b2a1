"""What a stage may report while it runs; the task passes in an MLflow-backed tracker."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol


class Tracker(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...


log = logging.getLogger(__name__)


def note(tracker: Tracker, text: str) -> None:
    """A line a person following the run should read (the guard's trips): through the tracker's
    `note` where it has one (the task's tracker puts it in the run's log, which `--watch`
    shows), else as a warning of this process."""
    send = getattr(tracker, "note", None)
    if callable(send):
        send(text)
    else:
        log.warning("%s", text)


class NullTracker:
    """Records nothing: for tests and for running a stage by hand."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        return None

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        return None
