"""How much the tiny world's base depends on its batch order: the bootstrap, trained once per
training seed (which sets only the batch order; the initial weights follow the world's seed) and
batching (`length_window`), then evaluated on the held-out problems as the pipeline evaluates it.
Besides pass@1 it prints where a base goes wrong: the share of written equations whose arithmetic
holds, and the share of first equations whose operands are the question's first two numbers (a
base that has not learnt to copy operands from the question computes well and still fails).

The base's arithmetic decides what every later stage can reach, so a setting of the corpus or of
the pretraining is only worth keeping when it holds across seeds. Each combination trains the
profile's bootstrap from scratch (minutes each on 2 cores) into `--out`, which a rerun reuses.

    python -m benchmarks.base_robustness --seeds 0 1 --windows 0 32
    python -m benchmarks.base_robustness --seeds 0 1 --set bootstrap.corpus.fact_docs=8000
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

from configs.profiles import load_profile  # noqa: E402
from rewards.steps import check_steps  # noqa: E402
from stages import bootstrap, evaluate, problems  # noqa: E402
from stages.tracker import NullTracker  # noqa: E402

_NUMBER = re.compile(r"\d+")


def step_rates(questions: list[str], completions: list[str]) -> tuple[float, float]:
    """(share of equations `a op b = c` that are right, share of samples with equations whose
    first one takes its operands from the question's first two numbers)."""
    right = written = copied = with_steps = 0
    for question, completion in zip(questions, completions, strict=True):
        checks = check_steps(question, completion)
        written += len(checks)
        right += sum(c.right for c in checks)
        if checks:
            with_steps += 1
            asked = tuple(float(n) for n in _NUMBER.findall(question)[:2])
            copied += asked == checks[0].operands
    return right / max(written, 1), copied / max(with_steps, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument(
        "--windows", type=int, nargs="+", default=None, help="length_window values (profile's)"
    )
    parser.add_argument("--set", action="append", default=[], help="profile override key=value")
    parser.add_argument("--out", type=Path, default=None, help="where the bases go (a temp dir)")
    args = parser.parse_args()
    base_config = load_profile(args.profile, args.set)
    torch.set_num_threads(base_config.torch_threads)
    out = args.out or Path(tempfile.mkdtemp(prefix="base-robustness-"))
    problem_set = problems.run(base_config.data, out / "problems")
    windows = args.windows or [base_config.bootstrap.train.length_window]
    evaluation = base_config.evaluation.model_copy(update={"general_prompts": 0})
    print(f"{' '.join([args.profile, *args.set])}: bases under {out}")
    for window in windows:
        for seed in args.seeds:
            overrides = [f"bootstrap.train.seed={seed}", f"bootstrap.train.length_window={window}"]
            config = load_profile(args.profile, [*args.set, *overrides])
            began = time.perf_counter()
            run_dir = out / f"window{window}-seed{seed}"
            model = bootstrap.run(
                config.bootstrap, problem_set, run_dir, NullTracker(), seed=config.data.world.seed
            )
            seconds = time.perf_counter() - began
            report = evaluate.run(evaluation, model, problem_set, run_dir / "eval", NullTracker())
            k = evaluation.k
            keys = ("pass_at_1", "pass_at_1_lenient", f"pass_at_{k}_lenient", "format_rate")
            shown = ", ".join(f"{key} {report.metrics[key]:.3f}" for key in keys)
            for family in ("math", "code", "logic"):
                if f"{family}/pass_at_1" in report.metrics:
                    figures = " ".join(
                        f"{report.metrics[f'{family}/{key}']:.3f}" for key in keys[1:3]
                    )
                    shown += f"; {family} lenient pass@1, pass@{k} {figures}"
            samples = pq.read_table(report.samples_path).to_pydict()
            right, copied = step_rates(samples["question"], samples["completion"])
            shown += f"; equations right {right:.3f}, first operands copied {copied:.3f}"
            print(f"length_window {window:>3}, seed {seed}: trained {seconds:.0f} s; {shown}")


if __name__ == "__main__":
    main()
