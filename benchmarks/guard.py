"""The RL guard on a finished GRPO stage: its rules replayed over the stage's recorded history
(what they would have said at each step, with any profile's settings), and what the guard costs
against the stage's own step time.

    python -m benchmarks.guard STAGE_DIR --profile tiny --section reasoning_rl [--set KEY=VALUE]
    python -m benchmarks.guard --state STATE_DIR --profile tiny [--set KEY=VALUE]
    python -m benchmarks.guard --state STATE_DIR --run RUN_ID --section r1_zero [--set KEY=VALUE]
    python -m benchmarks.guard --signals 32x16x1500 [16x8x400 ...]

Each report sets the trips beside those of the unpaired reading alone (`overpay` and `fall` off,
the probe's per-problem values left out, so no sampling allowance on the gap: the guard before
guard/paired.py); a stage recorded before the probe kept its per-problem values gives the same
trips in both.

The second form goes over every GRPO stage of a finished run's state folder (R1-Zero, stages 3
and 6, the RL-only twins), with the settings the run was given (`--set`, as to `r1 run`): each
stage's trips replayed, and the guard's whole cost (its checks, as the stage recorded them in
`guard.json`, and the step signals) against the stage's recorded seconds.

`--run` replays a stage's MLflow run instead (every step it logged: a stage the guard stopped
keeps only the checkpoint before the rule's window). Each report also gives the widest `gap`
at which `reward_without_skill` would have tripped somewhere in the stage, with the probe's
sampling allowance and, in brackets, without it: how near an honest stage came to its bound, or
how far past it a hacked one went.

`--problems N [N ...]` replays each stage as if its probe had drawn only its first N problems
(what a smaller probe reads: the probe takes the held-out file's first problems, and every row
samples from its own stream): each probe's per-problem values past the first N are dropped and
the held-out pass rates the guard reads recomputed from the rest. The probe's seconds are then
given in proportion, an estimate: `python -m benchmarks.probe_cost` times the probe itself.

`--every N [N ...]` replays each stage as if it had probed every N steps only (a multiple of its
own interval, on the schedule `rl.probing.probe_steps` gives): the other probes' readings left
out. With `--problems`, every pairing of the two.

`--signals PROMPTSxGROUPxWORDS` times the step's text signals (repetition, language
consistency: rl/signals.py) on a synthetic batch of that size, words of prose and numbers, for
batches larger than the tiny world's.

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
from guard.paired import ITEMS, PAID
from guard.skill import reward_without_skill
from guard.watch import Guard, skill_pairs
from rl.probing import probe_steps


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


def run_history(state: Path, run_id: str) -> list[dict[str, float]]:
    """A stage's step metrics as its MLflow run in `state` logged them, one dict per step."""
    from mlflow import MlflowClient

    store = state / "mlflow.db"
    if not store.is_file():  # MLflow would make an empty store there
        raise SystemExit(f"no MLflow store at {store}: --state is a run's state folder")
    client = MlflowClient(f"sqlite:///{store}")
    rows: dict[int, dict[str, float]] = {}
    for key in client.get_run(run_id).data.metrics:
        if key.startswith(("guard/", "stage/")):
            continue
        for metric in client.get_metric_history(run_id, key):
            rows.setdefault(metric.step, {"step": float(metric.step)})[key] = metric.value
    return [rows[step] for step in sorted(rows)]


def cut_probes(history: list[dict[str, float]], problems: int) -> list[dict[str, float]]:
    """`history` with each probe cut to its first `problems` problems: per-problem values of
    later problems dropped, each held-out reading that has per-problem values recomputed as
    their mean (with one sample a problem, the pass rate over the problems kept), and the
    probe's seconds scaled by the share of problems kept."""
    cut = []
    for entry in history:
        items = {k: v for k, v in entry.items() if k.startswith(ITEMS)}
        if not items:
            cut.append(entry)
            continue
        kept = {k: v for k, v in items.items() if int(k.rsplit("/", 1)[1]) < problems}
        new = {k: v for k, v in entry.items() if not k.startswith(ITEMS)} | kept
        drawn = {k.rsplit("/", 1)[1] for k in items if not k.startswith(PAID)}
        for prefix in {k.rsplit("/", 1)[0] for k in kept if not k.startswith(PAID)}:
            values = [v for k, v in kept.items() if k.rsplit("/", 1)[0] == prefix]
            new["heldout/" + prefix.removeprefix(ITEMS)] = fmean(values)
        if "time/probe_seconds" in entry and drawn:
            share = min(1.0, problems / len(drawn))
            new["time/probe_seconds"] = entry["time/probe_seconds"] * share
        cut.append(new)
    return cut


def thin_probes(history: list[dict[str, float]], every: int) -> list[dict[str, float]]:
    """`history` as a stage probing every `every` steps would have it (a multiple of the
    stage's own interval): the probe's readings, per-problem values and seconds left out of the
    entries of the other probes (before training, every `every` steps and the last step stay)."""
    steps = max(int(h.get("step", 0)) for h in history) if history else 0
    kept = set(probe_steps(every, steps))
    thinned = []
    for entry in history:
        if int(entry.get("step", 0)) in kept or not any(k.startswith("heldout/") for k in entry):
            thinned.append(entry)
            continue
        probe_keys = ("heldout/", ITEMS, "time/probe_seconds")
        thinned.append({k: v for k, v in entry.items() if not k.startswith(probe_keys)})
    return thinned


Shape = tuple[int | None, int | None]  # a probe's problems and interval; None: as recorded


def shapes(problems: list[int], every: list[int]) -> list[Shape]:
    """Every pairing of the problems and intervals asked for (as recorded where none is)."""
    return [(n, e) for n in (problems or [None]) for e in (every or [None])]


def reshaped(history: list[dict[str, float]], shape: Shape) -> list[dict[str, float]]:
    """`history` as a probe of that shape would have written it."""
    problems, every = shape
    history = history if problems is None else cut_probes(history, problems)
    return history if every is None else thin_probes(history, every)


def shape_text(shape: Shape) -> str:
    problems, every = shape
    return f"{problems or 'recorded'} / {every or 'recorded'}"


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
        if history[end - 1].get("step", 1) < 1:
            continue  # the probe before the first step: the stage checks after each step
        began = time.perf_counter()
        verdict = guard.verdict(guard.check(history[:end]), 0)
        seconds.append(time.perf_counter() - began)
        if verdict is None:
            continue
        trips += verdict.records()  # every rule that tripped at the step, with its action
        if verdict.action != "warn":
            break
    return trips, fmean(seconds) if seconds else 0.0


def unpaired(config: GRPOConfig) -> GRPOConfig:
    """`config` with `reward_without_skill`'s paired readings off: the guard before them."""
    guard = config.guard
    rule = guard.reward_without_skill.model_copy(update={"overpay": None, "fall": None})
    return config.model_copy(
        update={"guard": guard.model_copy(update={"reward_without_skill": rule})}
    )


def without_items(history: list[dict[str, float]]) -> list[dict[str, float]]:
    """`history` without the probe's per-problem values: as the guard before guard/paired.py
    read it (its gap with no sampling allowance)."""
    return [{k: v for k, v in h.items() if not k.startswith(ITEMS)} for h in history]


def before_paired(config: GRPOConfig, history: list[dict[str, float]]) -> list[dict]:
    """The trips of the guard before guard/paired.py: the unpaired reading alone."""
    return replay(unpaired(config), without_items(history))[0]


def said(trips: list[dict]) -> str:
    return "; ".join(f"{t['rule']}@{t['step']} ({t['action']})" for t in trips) or "none"


def widest_gap(config: GRPOConfig, history: list[dict[str, float]]) -> float | None:
    """The widest `gap` (to 0.01) at which `reward_without_skill`'s gap reading, its other
    settings as configured, trips at some step of `history` (with the probe's sampling
    allowance where `history` keeps per-problem values; `without_items` for the reading
    before it); None where it trips at none (the paired readings have no `gap`: they are left
    out)."""
    rule, pairs = unpaired(config).guard.reward_without_skill, skill_pairs(config.rewards)
    widest = 0
    for end in range(1, len(history) + 1):
        # a rule that trips at a gap trips at every narrower one
        while reward_without_skill(
            history[:end], rule.model_copy(update={"gap": (widest + 1) / 100}), pairs
        ):
            widest += 1
    return widest / 100 if widest else None


def gap_text(gap: float | None) -> str:
    return "-" if gap is None else f"{gap:.2f}"


def gaps_text(config: GRPOConfig, history: list[dict[str, float]]) -> str:
    """The widest gap as the rule reads it, and in brackets as the guard before
    guard/paired.py read it (no sampling allowance)."""
    now, before = widest_gap(config, history), widest_gap(config, without_items(history))
    return f"{gap_text(now)} ({gap_text(before)})"


def signals_seconds(prompts: int, group: int, words: int, seed: int = 0) -> tuple[float, int]:
    """Seconds the text signals take over `prompts` x `group` completions of `words` words
    each (prose and numbers), and the characters they hold."""
    import random

    from problems.types import Problem
    from rl.signals import text_signals
    from sampling.interface import Completion

    rng = random.Random(seed)
    vocabulary = [
        "the",
        "answer",
        "is",
        "so",
        "we",
        "add",
        "subtract",
        "multiply",
        "then",
        "check",
        "step",
        "result",
    ]

    def text() -> str:
        return " ".join(
            rng.choice(vocabulary) if rng.random() < 0.7 else str(rng.randint(0, 999))
            for _ in range(words)
        )

    batch = [Problem(id=str(i), question="q", answer="1") for i in range(prompts)]
    groups = [[Completion(text(), [], [], "stop") for _ in range(group)] for _ in batch]
    began = time.perf_counter()
    text_signals(batch, groups)
    return time.perf_counter() - began, sum(len(c.text) for g in groups for c in g)


# each GRPO stage's folder under the state folder's runs/ and its config key in the profile
STAGES = {
    "r1_zero_rl": "r1_zero",
    "reasoning_rl": "reasoning_rl",
    "all_scenarios_rl": "all_scenarios_rl",
    "rl_only_qwen": "distillation.rl_twin",
    "rl_only_llama": "distillation.rl_twin",
}


def state_report(state: Path, profile: str, overrides: list[str], asked: list[Shape]) -> None:
    """Every GRPO stage of a finished run under `state`: its trips replayed with the settings
    the run had (as each probe shape `asked` would have read it), the outcome the stage
    recorded, and what the guard cost it: its checks and step signals, and with its probe (a cut
    probe's seconds in proportion, the stage's seconds less what the cut saves)."""
    from stages.guarded import GUARD_RECORD

    print(
        "| stage | probe problems / every | steps | trips replayed | unpaired only "
        "| widest gap (unpaired) "
        "| outcome recorded | guard s | signals s | probe s | stage s | cost | with probe |"
    )
    print("|---|---:|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for stage, key in STAGES.items():
        for stage_dir in sorted((state / "runs" / stage).glob("*/checkpoints")):
            config = section(profile, overrides, key)
            recorded = stage_history(stage_dir.parent)
            record_path = stage_dir / GUARD_RECORD
            record = json.loads(record_path.read_text()) if record_path.exists() else {}
            guard = float(record.get("seconds", 0.0))
            signals = sum(h.get("time/signals_seconds", 0.0) for h in recorded)
            full_probe = sum(h.get("time/probe_seconds", 0.0) for h in recorded)
            seconds = stage_seconds(state, stage, stage_dir.parent.name)
            steps = sum("reward/mean" in h for h in recorded)
            for shape in asked:
                history = reshaped(recorded, shape)
                trips, _ = replay(config, history)
                before = before_paired(config, history)
                probe = sum(h.get("time/probe_seconds", 0.0) for h in history)
                total = seconds - full_probe + probe if seconds else None
                cost = f"{(guard + signals) / total:.2%}" if total else "-"
                with_probe = f"{(guard + signals + probe) / total:.1%}" if total else "-"
                print(
                    f"| {stage} | {shape_text(shape)} | {steps} "
                    f"| {said(trips)} | {said(before)} "
                    f"| {gaps_text(config, history)} "
                    f"| {record.get('outcome', '-')} | {guard:.2f} | {signals:.2f} "
                    f"| {probe:.1f} | {total or float('nan'):.0f} | {cost} | {with_probe} |"
                )


def stage_seconds(state: Path, stage: str, key: str) -> float | None:
    """The seconds the stage's MLflow run recorded (`stage/seconds`), found by its key."""
    from mlflow import MlflowClient

    from storage.tracking import STAGE_KEY_TAG, STAGE_TAG

    client = MlflowClient(f"sqlite:///{state / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, filter_string=f"tags.`{STAGE_TAG}` = '{stage}'")
    for run in runs:
        if run.data.tags.get(STAGE_KEY_TAG, "").startswith(key):
            return run.data.metrics.get("stage/seconds")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stages", nargs="*", type=Path)
    parser.add_argument("--state", type=Path, help="a finished run's state folder: every stage")
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--section", default="reasoning_rl", help="the GRPO stage's config key")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument(
        "--run", action="append", default=[], dest="runs", help="a stage's MLflow run (--state)"
    )
    parser.add_argument(
        "--problems", nargs="+", type=int, default=[], help="replay each probe cut to N problems"
    )
    parser.add_argument(
        "--every", nargs="+", type=int, default=[], help="replay probes every N steps only"
    )
    parser.add_argument("--signals", nargs="+", default=[], metavar="PROMPTSxGROUPxWORDS")
    args = parser.parse_args()
    for size in args.signals:
        parts = size.split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            parser.error(f"--signals {size!r}: expected PROMPTSxGROUPxWORDS, e.g. 32x16x1500")
        prompts, group, words = (int(n) for n in parts)
        seconds, chars = signals_seconds(prompts, group, words)
        print(
            f"text signals, {prompts} x {group} completions of {words} words "
            f"({chars / 1e6:.2f} M characters): {seconds * 1e3:.0f} ms a step"
        )
    if args.signals:
        return
    if args.runs and args.state is None:
        parser.error("--run reads the MLflow store of --state")
    if args.state is not None and not args.runs:
        state_report(args.state, args.profile, args.overrides, shapes(args.problems, args.every))
        return
    config = section(args.profile, args.overrides, args.section)
    histories = [(str(d), stage_history(d)) for d in args.stages]
    histories += [(f"run {r}", run_history(args.state, r)) for r in args.runs]
    for label, recorded in histories:
        for shape in shapes(args.problems, args.every):
            history = reshaped(recorded, shape)
            print(stage_text(config, f"{label}, probe {shape_text(shape)}", history))


def stage_text(config: GRPOConfig, label: str, history: list[dict[str, float]]) -> str:
    """One stage's replay: its step time, the guard's cost, every trip, the unpaired reading's
    trips and the widest gap."""
    trips, check = replay(config, history)
    steps = [h["time/step_seconds"] for h in history if "time/step_seconds" in h]
    signals = [h["time/signals_seconds"] for h in history if "time/signals_seconds" in h]
    probe = sum(h.get("time/probe_seconds", 0.0) for h in history)
    step = fmean(steps) if steps else float("nan")
    lines = [f"{label}: {len(steps)} steps, {step:.3f} s a step, probe {probe:.1f} s"]
    lines.append(f"  guard check {check * 1e3:.3f} ms a step: {check / step:.4%} of a step")
    if signals:
        lines.append(f"  signals {fmean(signals) * 1e3:.3f} ms a step: {fmean(signals) / step:.4%}")
    for trip in trips:
        where = f"{trip['rule']} at step {trip['step']} ({trip['action']})"
        lines.append(f"  trip: {where}: {trip['reason']}")
    if not trips:
        lines.append("  no trip")
    before = before_paired(config, history)
    lines.append(f"  the unpaired reading alone (the guard before guard/paired.py): {said(before)}")
    bound = config.guard.reward_without_skill.gap
    lines.append(
        f"  reward_without_skill: widest gap {gaps_text(config, history)} (in brackets unpaired, "
        f"no sampling allowance; trips at {bound:.2f})"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
