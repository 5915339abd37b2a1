"""The RL guard on a finished GRPO stage: its rules replayed over the stage's recorded history
(what they would have said at each step, with any profile's settings), and what the guard costs
against the stage's own step time.

    python -m benchmarks.guard STAGE_DIR --profile tiny --section reasoning_rl [--set KEY=VALUE]

STAGE_DIR is a GRPO stage's folder (`runs/<stage>/<key>/` in the state folder): its last
checkpoint holds the history the trainer kept, each step's metrics as the guard read them. The
rules are pure functions of that history, so replaying them step by step gives the trips the
guard would have made online (a warning, or the stop that would have ended the stage there).
The cost printed is the guard's per-step check replayed here, and, where the stage logged it,
the signals' own time (`time/signals_seconds`), against the stage's step time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from statistics import fmean

from configs.profiles import load_profile
from configs.reinforcement import GRPOConfig
from guard.watch import Guard


def stage_history(stage_dir: Path) -> list[dict[str, float]]:
    """The trainer's history in the stage's last checkpoint (or a JSON-lines file of step
    metrics, one object with its `step` per line)."""
    if stage_dir.suffix == ".jsonl":
        rows = [json.loads(line) for line in stage_dir.read_text().splitlines() if line]
        return [r for r in rows if "reward/mean" in r or any(k.startswith("heldout/") for k in r)]
    import torch

    from training.checkpoints import checkpoint_file

    path = checkpoint_file(stage_dir / "checkpoints")
    if path is None:
        raise SystemExit(f"no checkpoint under {stage_dir / 'checkpoints'}")
    return list(torch.load(path, weights_only=False)["history"])


def section(profile: str, overrides: list[str], dotted: str) -> GRPOConfig:
    node = load_profile(profile, overrides)
    for key in dotted.split("."):
        node = getattr(node, key)
    assert isinstance(node, GRPOConfig), f"{dotted} is not a GRPO stage"
    return node


def replay(config: GRPOConfig, history: list[dict[str, float]]) -> tuple[list[dict], float]:
    """The trips the guard makes on `history` step by step, as it acts (a warned rule is quiet
    after; a stop or rollback ends the replay), and the mean seconds of one check."""
    guard = Guard(config.guard, config.rewards, config.probe.every > 0, kl=config.beta > 0)
    trips, seconds = [], []
    for end in range(1, len(history) + 1):
        began = time.perf_counter()
        verdict = guard.verdict(guard.check(history[:end]), 0)
        seconds.append(time.perf_counter() - began)
        if verdict is None:
            continue
        trips += [t.to_dict() | {"action": guard.action_of(t)} for t in verdict.trips]
        if verdict.action != "warn":
            break
    return trips, fmean(seconds) if seconds else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stages", nargs="+", type=Path)
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--section", default="reasoning_rl", help="the GRPO stage's config key")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    config = section(args.profile, args.overrides, args.section)
    for stage_dir in args.stages:
        history = stage_history(stage_dir)
        trips, check = replay(config, history)
        steps = [h["time/step_seconds"] for h in history if "time/step_seconds" in h]
        signals = [h["time/signals_seconds"] for h in history if "time/signals_seconds" in h]
        step = fmean(steps) if steps else float("nan")
        print(f"{stage_dir}: {len(steps)} steps, {step:.3f} s a step")
        print(f"  guard check {check * 1e3:.3f} ms a step: {check / step:.4%} of a step")
        if signals:
            print(f"  signals {fmean(signals) * 1e3:.3f} ms a step: {fmean(signals) / step:.4%}")
        for trip in trips:
            where = f"{trip['rule']} at step {trip['step']} ({trip['action']})"
            print(f"  trip: {where}: {trip['reason']}")
        if not trips:
            print("  no trip")


if __name__ == "__main__":
    main()
