"""The state folder: everything a pipeline run keeps lives under one directory.

`R1_STATE_DIR` moves it (default: `./state`). Inside: the MLflow SQLite store and artifacts, the
DuckDB file, stage outputs and checkpoints, and Prefect's home.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

STATE_ENV = "R1_STATE_DIR"


def env_seconds(name: str, default: float) -> float:
    """A duration in seconds from the environment variable `name`; a bad value names it."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"{name}={raw!r}: expected a number of seconds >= 0")
    return seconds


@dataclass(frozen=True)
class StatePaths:
    root: Path

    @classmethod
    def from_env(cls, default: str | Path = "state") -> StatePaths:
        return cls(Path(os.environ.get(STATE_ENV) or default).resolve())

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.mlflow_db}"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlartifacts"

    @property
    def duckdb(self) -> Path:
        return self.root / "r1.duckdb"

    @property
    def prefect_home(self) -> Path:
        return self.root / "prefect"

    @property
    def runs(self) -> Path:
        """Stage outputs (data, models, checkpoints): `runs/<stage>/<stage key>/`."""
        return self.root / "runs"

    @property
    def faults(self) -> Path:
        """Markers of injected one-time failures that have fired."""
        return self.root / "faults"

    def ensure(self) -> StatePaths:
        for path in (self.root, self.mlflow_artifacts, self.prefect_home, self.runs):
            path.mkdir(parents=True, exist_ok=True)
        return self
