"""Reading a stage's metric history: one dict of metrics per step, each with its `step`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import fmean

History = Sequence[Mapping[str, float]]
Point = tuple[int, float]
# In an entry of a probe read after the step it measured (rl/probing.py): that step, the policy
# version it probed. The entry's `step` is the step that read it, where the guard reads it.
PROBE_VERSION = "probe/policy_version"


def series(history: History, key: str) -> list[Point]:
    """(step, value) wherever the history holds `key`, in step order."""
    return [(int(h["step"]), float(h[key])) for h in history if key in h and "step" in h]


def last_step(history: History) -> int:
    return int(history[-1]["step"]) if history else 0


def mean_between(points: Sequence[Point], start: int, end: int) -> float | None:
    """The mean of the values at steps start < step <= end; None when there are none."""
    values = [v for s, v in points if start < s <= end]
    return fmean(values) if values else None


def recent(points: Sequence[Point], end: int, window: int) -> float | None:
    """The mean over the `window` steps up to `end`; None unless the window is at least half
    covered (a metric logged only on some steps is read where it was logged)."""
    values = [v for s, v in points if end - window < s <= end]
    return fmean(values) if len(values) * 2 >= window else None


def first(points: Sequence[Point], window: int) -> tuple[float, int] | None:
    """The mean over the stage's first `window` steps that hold the metric (steps counted from
    the first one logged) and the last step among them; None before the window is complete."""
    if not points:
        return None
    start = points[0][0] - 1
    values = [(s, v) for s, v in points if s <= start + window]
    if points[-1][0] < start + window:
        return None
    return fmean(v for _, v in values), values[-1][0]


def baseline(history: History, key: str, window: int) -> tuple[float, float] | None:
    """(the mean over the stage's first `window` steps, the mean over the last `window`) of
    `key`, once the two windows no longer overlap; else None."""
    points, now = series(history, key), last_step(history)
    start, level = first(points, window), recent(points, now, window)
    if start is None or level is None or now - window < start[1]:
        return None
    return start[0], level
