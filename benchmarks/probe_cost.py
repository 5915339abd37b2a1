"""What a GRPO stage's held-out probe costs on its trainer's path, and what each way of drawing and
grading it saves: drawn from a saved model with the stage's settings (its probe cut to each of
`--problems`), in the trainer's own HF sampler.

    python -m benchmarks.probe_cost --model STATE/runs/mixed_sft/KEY/model \\
        --heldout STATE/runs/problems/KEY/heldout.jsonl --section all_scenarios_rl \\
        --problems 300 128 [--repeat 3]

For each size, alternating within each repeat:
- sampling with a step's batch (prompts x group rows at a time, the trainer's sampler before
  3c779b5) and with the probe's rows in one batch (the trainer's on the CPU since then: a decode
  step's cost there is mostly per step, not per row);
- grading the same completions with the strict and the lenient reading apart (a sandbox session
  each, before 66d362d) and together (`rewards.verifiers.grade_readings`: one session, each
  program once).

Each line gives every timing, their mean, and the ratio of the means (new / old). The first
repeat includes the sampler's and sandbox's first use; read the later ones where they differ.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from statistics import fmean

from benchmarks.guard import section
from configs.reinforcement import GRPOConfig


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    began = time.perf_counter()
    out = fn()
    return time.perf_counter() - began, out


def probe_costs(
    config: GRPOConfig, model_dir: Path, heldout: Path, problems: int, repeat: int
) -> dict[str, list[float]]:
    """Seconds by way ("sample, a step's batch", "sample, one batch", "grade, apart", "grade,
    together"), `repeat` timings each, of the stage's probe cut to `problems` problems (the
    grading timed on what the probe grades: its problems' completions, both readings)."""
    from models.loading import load_model, load_tokenizer
    from problems.loader import load_problems
    from rewards.accuracy import verifiable_problems
    from rewards.verifiers import grade_all, grade_readings
    from rl.heldout import heldout_probe
    from sampling.factory import make_sampler

    tokenizer, model = load_tokenizer(model_dir), load_model(model_dir)
    sized = config.model_copy(
        update={"probe": config.probe.model_copy(update={"problems": problems})}
    )
    request = heldout_probe(sized, heldout, tokenizer).request
    drawn = verifiable_problems(load_problems(heldout), "the probe")[:problems]  # as it draws
    step_rows = config.prompts_per_step * config.group_size
    batches = {
        "sample, a step's batch": step_rows,
        "sample, one batch": max(step_rows, len(request.prompts) * request.n),
    }
    times: dict[str, list[float]] = {}
    for _ in range(repeat):
        for way, rows in batches.items():
            with make_sampler("hf", model, tokenizer, batch_size=rows, show_progress=False) as s:
                seconds, groups = timed(
                    lambda s=s: s.generate(request.prompts, request.n, request.params)
                )
            times.setdefault(way, []).append(seconds)
        flat = [p for p, group in zip(drawn, groups, strict=True) for _ in group]
        texts = [c.text for group in groups for c in group]
        apart = [(grade_all, (flat, texts, True)), (grade_all, (flat, texts, False))]
        for way, calls in (
            ("grade, apart", apart),
            ("grade, together", [(grade_readings, (flat, texts))]),
        ):
            began = time.perf_counter()
            for fn, args in calls:
                fn(*args)
            times.setdefault(way, []).append(time.perf_counter() - began)
    return times


def report(label: str, times: dict[str, list[float]]) -> str:
    """One line per way, and the ratio of each pair's means."""
    lines = [label]
    for way, values in times.items():
        lines.append(
            f"  {way:24s} " + " ".join(f"{v:.2f}" for v in values) + f"  mean {fmean(values):.2f} s"
        )
    for old, new in (
        ("sample, a step's batch", "sample, one batch"),
        ("grade, apart", "grade, together"),
    ):
        ratio = fmean(times[new]) / fmean(times[old])
        lines.append(f"  {new} / {old}: {ratio:.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probe_cost", description=__doc__)
    parser.add_argument("--model", type=Path, required=True, help="a saved model folder")
    parser.add_argument("--heldout", type=Path, required=True, help="the held-out problems")
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--section", default="reasoning_rl", help="the GRPO stage's config key")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--problems", nargs="+", type=int, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for name in ("model", "heldout"):
        if not getattr(args, name).exists():
            parser.error(f"--{name} {getattr(args, name)}: no such file or folder")
    if min(args.problems) < 1 or args.repeat < 1:
        parser.error("--problems and --repeat take counts of 1 or more")
    config = section(args.profile, args.overrides, args.section)
    for problems in args.problems:
        times = probe_costs(config, args.model, args.heldout, problems, args.repeat)
        print(report(f"{args.section}, probe of {problems} problems", times), flush=True)


if __name__ == "__main__":
    main()
