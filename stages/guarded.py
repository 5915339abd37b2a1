"""A GRPO stage under its guard (guard/): after every step the guard reads the stage's metric
history, and a rule that trips warns, stops the stage, or rolls it back.

- warn: a line in the run's log; the stage goes on, and its model is not given the stage's
  alias (tasks/reasoning_rl.py reads `guard.json`).
- stop: GuardStop, the stage ends Failed naming every rule that tripped at the step (the
  primary one first), their numbers and the step; the checkpoint from before the earliest
  stopping rule's window becomes the stage's last checkpoint (kept).
- rollback: the stage goes on from the last checkpoint before the rule's window, through the
  trainer's own resume path, with the learning rate lowered (or, for a gamed term, that term's
  weight), at most `rollback.max_times` times; then a trip stops it.

A rollback needs a checkpoint from before the window: each checkpoint the loop writes is kept
as a hard link (`kept/step-N.pt`, no copy) for as long as some rule's window may reach back to
it. What happened is in `guard.json` beside the checkpoints: a stage killed after a rollback
resumes with its adjustments.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from configs.reinforcement import GRPOConfig
from evaluation.curves import plot_guard_trip
from guard.paired import ITEMS
from guard.stop import GuardStop
from guard.trip import Trip
from guard.watch import Guard, Verdict
from problems.types import Problem
from rl.probing import longest_probe_gap
from rl.trainer import GRPOReport, GRPOTrainer
from stages.tracker import Tracker, note
from training.checkpoints import checkpoint_file, save_checkpoint

log = logging.getLogger(__name__)

GUARD_RECORD = "guard.json"
KEPT = "kept"


class _Tripped(Exception):
    """A verdict of stop or rollback, out of the trainer's loop to `train_guarded`."""

    def __init__(self, verdict: Verdict):
        super().__init__(verdict.trip.reason)
        self.verdict = verdict


@dataclass
class GuardRecord:
    """What the guard did in a stage, as `guard.json` holds it."""

    rules: list[str] = field(default_factory=list)  # the rules it checked
    idle: dict[str, str] = field(default_factory=dict)  # enabled rules with nothing to read
    trips: list[dict[str, Any]] = field(default_factory=list)  # each with its `action`
    rollbacks: list[dict[str, Any]] = field(default_factory=list)
    learning_rate: float | None = None  # after rollbacks
    weights: dict[str, float] = field(default_factory=dict)  # terms lowered by rollbacks
    outcome: str = "running"  # clean, warned, stopped, or rolled back (then clean or warned)
    seconds: float = 0.0  # the guard's own time: its checks and its checkpoint links
    stop_rules: list[str] = field(default_factory=list)  # each rule tripped at a stop's step

    @classmethod
    def find(cls, out_dir: Path) -> GuardRecord | None:
        """The record a GRPO stage left in its folder (beside its checkpoints, or its DeepSpeed
        workers' run folder); None when there is none."""
        for folder in (out_dir / "checkpoints", out_dir / "deepspeed"):
            if (folder / GUARD_RECORD).exists():
                return cls.load(folder)
        return None

    @classmethod
    def load(cls, folder: Path) -> GuardRecord:
        path = folder / GUARD_RECORD
        return cls(**json.loads(path.read_text())) if path.exists() else cls()

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / GUARD_RECORD
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    def adjusted(self, config: GRPOConfig) -> GRPOConfig:
        """`config` with the rollbacks' learning rate and term weights."""
        rewards = [
            t.model_copy(update={"weight": self.weights[t.name]}) if t.name in self.weights else t
            for t in config.rewards
        ]
        update: dict[str, Any] = {"rewards": rewards}
        if self.learning_rate is not None:
            update["learning_rate"] = self.learning_rate
        return config.model_copy(update=update)

    def tripped(self) -> list[dict[str, Any]]:
        """The trips of the branch that made the model (after the last rollback)."""
        since = self.rollbacks[-1]["trips_before"] if self.rollbacks else 0
        return self.trips[since:]

    def last_trips(self) -> list[dict[str, Any]]:
        """The trips of the guard's last verdict: every one at the last trip's step, on its
        branch (a stop's or a warning's rules all, not only the last one recorded)."""
        if not self.trips:
            return []
        starts = [0] + [r["trips_before"] for r in self.rollbacks]
        start = max(s for s in starts if s < len(self.trips))
        step, found = self.trips[-1]["step"], []
        for trip in reversed(self.trips[start:]):
            if trip["step"] != step:
                break
            found.append(trip)
        return found[::-1]


class CheckpointKeeper:
    """Hard links to the loop's checkpoints (`kept/step-N.pt`), as far back as a rule's window
    reaches, and the way back to one of them."""

    def __init__(self, ckpt_dir: Path, reach: int):
        self.ckpt_dir, self.reach = ckpt_dir, reach
        self.folder = ckpt_dir / KEPT

    def steps(self) -> list[int]:
        return sorted(int(p.stem.split("-")[1]) for p in self.folder.glob("step-*.pt"))

    def keep(self, step: int, now: int) -> None:
        """Link the checkpoint of `step` (the loop's last), and let go of those no window of a
        check at `now` or later can need: all but the newest at or before `now - reach`."""
        source = checkpoint_file(self.ckpt_dir)
        target = self.folder / f"step-{step:06d}.pt"
        if step and source is not None and not target.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            os.link(source, target)
        older = [s for s in self.steps() if s <= now - self.reach]
        for s in older[:-1]:
            (self.folder / f"step-{s:06d}.pt").unlink(missing_ok=True)

    def before(self, step: int) -> int:
        """The newest kept checkpoint at or before `step` (0: none, the stage's start)."""
        return max((s for s in self.steps() if s <= step), default=0)

    def drop_after(self, step: int) -> None:
        """Let go of the kept checkpoints after `step` (a branch given up)."""
        for s in self.steps():
            if s > step:
                (self.folder / f"step-{s:06d}.pt").unlink(missing_ok=True)

    def restore(self, step: int, fingerprint: str, learning_rate: float | None = None) -> None:
        """Make the checkpoint of `step` the loop's last (no checkpoint when 0: the stage starts
        over), with `learning_rate` in its optimizer state when given."""
        if step == 0:
            for name in ("last", "last.old", "last.tmp"):
                _remove(self.ckpt_dir / name)
            return
        state = torch.load(self.folder / f"step-{step:06d}.pt", weights_only=False)
        if state.get("fingerprint") != fingerprint:
            raise RuntimeError(f"kept checkpoint of step {step} belongs to another run")
        if learning_rate is not None and "optimizer" in state:
            for group in state["optimizer"]["param_groups"]:
                group["lr"] = learning_rate
        save_checkpoint(self.ckpt_dir, state)


def _remove(path: Path) -> None:
    if path.is_dir():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()


class StepWatch:
    """The trainer's per-step hook: keeps checkpoints within reach, checks the rules, reports
    each trip (a warning line, a `guard/<rule>` metric) and hands a stop or a rollback out of the
    loop."""

    def __init__(
        self,
        guard: Guard,
        trainer: GRPOTrainer,
        keeper: CheckpointKeeper,
        record: GuardRecord,
        tracker: Tracker,
        desc: str,
        plots: Path,
    ):
        self.guard, self.trainer, self.keeper = guard, trainer, keeper
        self.record, self.tracker, self.desc, self.plots = record, tracker, desc, plots

    def __call__(self, step: int, history: list[dict[str, float]]) -> None:
        began = time.perf_counter()
        self.keeper.keep(self.trainer.guard.checkpoint_step, step)
        verdict = self.guard.verdict(self.guard.check(history), len(self.record.rollbacks))
        self.record.seconds += time.perf_counter() - began
        if verdict is None:
            return
        for trip, action in zip(verdict.trips, verdict.actions, strict=True):
            self.record.trips.append(trip.to_dict() | {"action": action})
            self.tracker.log_metrics({f"guard/{trip.rule}": 1.0}, step)
            note(
                self.tracker,
                f"{self.desc}: guard: {trip.rule} at step {step}: {trip.reason} ({action})",
            )
            self._plot(trip, history)
        if verdict.action in ("stop", "rollback"):
            # the loop logs a step's metrics after it: this one's would be lost with the branch
            last = {k: v for k, v in history[-1].items() if k != "step"}
            self.tracker.log_metrics(last, step)
            raise _Tripped(verdict)

    def _plot(self, trip: Trip, history: list[dict[str, float]]) -> None:
        """The curves around the trip, among the run's artifacts under `guard/`."""
        name = f"{trip.rule}_step{trip.step:05d}.png"
        margin = self.guard.config.curve_steps
        path = plot_guard_trip(
            history, self.guard.signal_keys(trip), trip.to_dict(), self.plots / name, margin
        )
        self.tracker.log_artifact(path, "guard")


def train_guarded(
    build: Callable[[GRPOConfig], GRPOTrainer],
    config: GRPOConfig,
    problems: Sequence[Problem],
    ckpt_dir: Path,
    fingerprint: str,
    tracker: Tracker,
    desc: str,
) -> tuple[GRPOReport, GuardRecord, Any]:
    """Train what `build(config)` makes on `problems` under `config.guard`, resuming from
    `ckpt_dir` as the trainer does; a rollback builds a new trainer (`config` adjusted) that
    resumes from the kept checkpoint. Returns the report, the guard's record and the model.
    Every trainer built is closed here."""
    record = GuardRecord.load(ckpt_dir)
    probed = config.probe.every > 0
    guard = Guard(config.guard, config.rewards, probed, kl=config.beta > 0)
    record.rules = [name for name in config.guard.rules() if guard.active(name)]
    record.idle = guard.idle()
    keeper = CheckpointKeeper(ckpt_dir, reach_of(config))
    while True:
        trainer = build(record.adjusted(config))
        trainer.on_step = StepWatch(
            guard, trainer, keeper, record, tracker, desc, ckpt_dir.parent / "guard"
        )
        try:
            report = trainer.train(problems, ckpt_dir, fingerprint)
        except _Tripped as tripped:
            trainer.close()
            verdict = tripped.verdict
            if verdict.action == "stop":
                raise _stopped(verdict, record, keeper, fingerprint, desc) from None
            _roll_back(verdict.trip, record, config, keeper, fingerprint)
            guard.forget()
            note(tracker, f"{desc}: guard: {describe_rollback(record.rollbacks[-1])}")
            tracker.log_metrics(
                {"guard/rollbacks": float(len(record.rollbacks))}, verdict.trip.step
            )
            continue
        except BaseException:
            trainer.close()
            record.save(ckpt_dir)
            raise
        trainer.close()
        record.outcome = outcome(record)
        record.save(ckpt_dir)
        return report, record, trainer.model


def reach_of(config: GRPOConfig) -> int:
    """How far back (in steps) a trip's window can start: the longest window, the longest gap
    between two probes (the rule reading the probe compares with one at least a window back),
    and an interval more where sampling workers may draw the probe (read an interval after the
    version it measured, rl/probing.py), and a checkpoint interval; and a rollback's
    `reach_back` before the window."""
    longest = max(rule.window for rule in config.guard.rules().values())
    rollback = config.guard.rollback.reach_back
    probing = longest_probe_gap(config.probe.every, config.steps)
    if config.probe.on_workers:
        probing += config.probe.every
    return longest + probing + config.checkpoint_every + rollback


def outcome(record: GuardRecord) -> str:
    """clean, warned (a rule warned on the branch that made the model), with `rolled back
    N times, ` before it when the stage rolled back."""
    state = "warned" if record.tripped() else "clean"
    return f"rolled back {len(record.rollbacks)}x, {state}" if record.rollbacks else state


def describe_rollback(rollback: dict[str, Any]) -> str:
    change = (
        f"learning rate {rollback['learning_rate']:.3g}"
        if "learning_rate" in rollback
        else f"{rollback['term']} weight {rollback['weight']:.3g}"
    )
    return (
        f"rolled back from step {rollback['at']} to step {rollback['to']} "
        f"({rollback['rule']}), {change}"
    )


def _stopped(
    verdict: Verdict, record: GuardRecord, keeper: CheckpointKeeper, fingerprint: str, desc: str
) -> GuardStop:
    """The stop of `verdict`, naming every rule that tripped at its step; the checkpoint before
    the earliest stopping rule's window made the stage's last, and the kept ones inside the
    window (the hacked policy's) let go."""
    kept = keeper.before(verdict.since - 1)
    keeper.drop_after(kept)
    keeper.restore(kept, fingerprint, record.learning_rate)
    record.outcome, record.stop_rules = "stopped", [t.rule for t in verdict.trips]
    record.save(keeper.ckpt_dir)
    return GuardStop(desc, verdict.records(), kept, str(keeper.ckpt_dir))


def _roll_back(
    trip: Trip,
    record: GuardRecord,
    config: GRPOConfig,
    keeper: CheckpointKeeper,
    fingerprint: str,
) -> None:
    """Back to the newest kept checkpoint before the trip's window (and `reach_back` steps
    more): a gamed term's weight lowered, else the learning rate; the kept checkpoints of the
    abandoned branch dropped."""
    factors = config.guard.rollback
    to = keeper.before(max(0, trip.since - 1 - factors.reach_back))
    entry: dict[str, Any] = {"at": trip.step, "rule": trip.rule, "to": to}
    entry["trips_before"] = len(record.trips)
    weights = {t.name: t.weight for t in config.rewards}
    if trip.rule == "gamed_term" and trip.subject in weights:
        weight = record.weights.get(trip.subject, weights[trip.subject])
        record.weights[trip.subject] = entry["weight"] = weight * factors.term_weight_factor
        entry["term"] = trip.subject
    else:
        rate = record.learning_rate or config.learning_rate
        record.learning_rate = entry["learning_rate"] = rate * factors.learning_rate_factor
    record.rollbacks.append(entry)
    keeper.drop_after(to)
    keeper.restore(to, fingerprint, record.learning_rate)
    record.save(keeper.ckpt_dir)


class MetricsWatch:
    """The guard over a stage whose trainer runs in worker processes (DeepSpeed): it reads each
    step's metrics as rank 0's are forwarded (`run_workers`' `log_metrics`), warns, or stops the
    stage, which stops the workers. Their checkpoint is DeepSpeed's one committed checkpoint,
    kept as it is (it may lie inside the rule's window: no rollback here). Rank 0's verdict
    counts are the ones read."""

    def __init__(
        self, config: GRPOConfig, tracker: Tracker, desc: str, folder: Path, probed: bool = False
    ):
        """`probed`: rank 0 runs the held-out probe; its readings come with the steps' metrics
        (the one before training on a line of its own) and its per-problem items on lines of
        their own (rl/grpo_worker.py `ItemsForwarder`), kept for the guard, not logged."""
        self.guard = Guard(config.guard, config.rewards, probed=probed, kl=config.beta > 0)
        self.record = GuardRecord(
            rules=[n for n in config.guard.rules() if self.guard.active(n)], idle=self.guard.idle()
        )
        self.tracker, self.desc, self.folder = tracker, desc, folder
        self.history: list[dict[str, float]] = []
        self._items: dict[int, dict[str, float]] = {}  # items that came before their step's line

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        items = {k: v for k, v in metrics.items() if k.startswith(ITEMS)}
        logged = {k: v for k, v in metrics.items() if k not in items}
        if logged:
            self.tracker.log_metrics(logged, step)
        if "reward/mean" not in metrics:  # a probe's, a resume's or a sync's line, not a step's
            self._keep(metrics, step)
            return
        began = time.perf_counter()
        self.history.append({"step": float(step), **metrics, **self._items.pop(step, {})})
        verdict = self.guard.verdict(self.guard.check(self.history), 0)
        self.record.seconds += time.perf_counter() - began
        self.record.outcome = "warned" if self.record.trips else "clean"
        if verdict is not None:
            self.record.trips += verdict.records()
            for trip in verdict.trips:
                note(self.tracker, f"{self.desc}: guard: {trip.rule} at step {step}: {trip.reason}")
            self.record.outcome = "stopped" if verdict.action == "stop" else "warned"
            if verdict.action == "stop":
                self.record.stop_rules = [t.rule for t in verdict.trips]
        self.record.save(self.folder)
        if verdict is not None and verdict.action == "stop":
            raise GuardStop(self.desc, verdict.records(), -1, str(self.folder))

    def _keep(self, metrics: dict[str, float], step: int) -> None:
        """A probe's reading before training, an entry of its own in the history the guard
        reads; or a reading's items, which join their step's entry: the one there already (the
        reading before training), else the step's line, which comes after them."""
        if any(k.startswith(ITEMS) for k in metrics):
            entry = next((h for h in reversed(self.history) if h["step"] == step), None)
            if entry is not None:
                entry.update(metrics)
            else:
                self._items.setdefault(step, {}).update(metrics)
        elif any(k.startswith("heldout/") for k in metrics):
            self.history.append({"step": float(step), **metrics})
