"""The state folder: everything a pipeline run keeps lives under one directory.

`R1_STATE_DIR` moves it (default: `./state`). Inside: the MLflow SQLite store and artifacts, the
DuckDB file, stage outputs and checkpoints, and Prefect's home.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import uuid
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


_NAME_MAX = 255  # bytes in one name of a path, on Linux's file systems


class StateFolderError(ValueError):
    """The state folder cannot be made where it is asked for; the message says why."""


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

    @property
    def stage_keys(self) -> Path:
        """Each stage key under its key without the code version (tasks/stage_cache.py)."""
        return self.root / "stage_keys"

    @property
    def locks(self) -> Path:
        """One lock file per stage key that a process computes now (tasks/stage_cache.py)."""
        return self.root / "locks"

    @property
    def identity_file(self) -> Path:
        return self.root / "state_id"

    def check_makeable(self) -> None:
        """Raise StateFolderError, making nothing, where the folder cannot be made or used: a
        file stands at its path or on the way to it, a name on the way is too long, or its path
        holds a `?`, which ends the MLflow store's path in its SQLite URI (the store would be made
        in another folder, cut at the `?`)."""
        if "?" in str(self.root):
            raise StateFolderError(
                f"state folder {self.root}: its path holds '?', which MLflow's store address "
                "(sqlite:///PATH) cannot carry: name a folder without it"
            )
        for part in (self.root, *self.root.parents):
            if len(part.name.encode()) > _NAME_MAX:
                raise StateFolderError(f"state folder {self.root}: the name {part.name[:40]!r}... "
                                       f"is over {_NAME_MAX} bytes")  # fmt: skip
        found = next(p for p in (self.root, *self.root.parents) if p.exists())
        if not found.is_dir():
            where = "is a file" if found == self.root else f"lies under a file, {found}"
            raise StateFolderError(f"state folder {self.root}: {where}, not a folder")

    def check_writable(self) -> None:
        """Raise StateFolderError where a file cannot be made in the folder or in the parts of
        it every run writes (Prefect's home, the stage folders, MLflow's artifacts): a folder on
        a disk mounted read-only, or without write permission. Prefect's server, whose database
        is in the folder, would otherwise meet it first, and the run end in pages of its
        tracebacks and a 500 from it."""
        for folder in (self.root, self.prefect_home, self.runs, self.mlflow_artifacts):
            try:
                tempfile.TemporaryFile(dir=folder).close()  # made, then gone
            except OSError as err:
                raise StateFolderError(
                    f"state folder {self.root}: cannot write in {folder}: {err.strerror or err}; "
                    "make it writable, or name another (--state-dir, R1_STATE_DIR)"
                ) from None

    def ensure(self) -> StatePaths:
        for path in (self.root, self.mlflow_artifacts, self.prefect_home, self.runs):
            path.mkdir(parents=True, exist_ok=True)
        self.identity()
        return self

    def identity(self) -> str | None:
        """This folder's own identity: a random id made with it and kept in it. Stage keys
        carry it, so a folder removed and made again at the same path never takes the stage
        results an older one left in a store outside it (a PREFECT_HOME set elsewhere keeps
        Prefect's results there): their files went with it. None while the folder does not
        exist, and for a folder that held stages before folders had identities (its file says
        so, empty): its keys stay what they were, and its finished stages stay finished.
        Made once, whoever comes first: the id is written under a name of its own, then linked
        into place, which fails if another process linked first; every reader sees a whole id."""
        try:
            return self.identity_file.read_text().strip() or None
        except FileNotFoundError:
            if not self.root.is_dir():
                return None
        made = "" if self._held_stages() else uuid.uuid4().hex
        draft = self.root / f".state_id.{os.getpid()}.{uuid.uuid4().hex}"
        draft.write_text(made)
        try:
            with contextlib.suppress(FileExistsError):  # another process linked first: theirs
                os.link(draft, self.identity_file)
        finally:
            draft.unlink()
        return self.identity_file.read_text().strip() or None

    def _held_stages(self) -> bool:
        """Whether stages ran here before (their key index, or their folders)."""
        return self.stage_keys.is_dir() or (self.runs.is_dir() and any(self.runs.iterdir()))
