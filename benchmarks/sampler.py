"""The decode loop (sampling/hf.py) against the previous `transformers.generate` sampler, and
against itself stepping through the model's own forward instead of plain tensor ops
(sampling/decode_step.py).

Same model, prompts, n, sampling settings and batch size; the three run in turn, `--repeats`
times each, in one process with 2 torch threads, so load from other processes on the machine
falls on all alike. Prints wall (and CPU) seconds and completion tokens per second of each
run, the best and median of each, and each speed-up: the median over repeats of the ratio of
the runs side by side, and best against best.

    python -m benchmarks.sampler --model state/runs/cold_start_sft/KEY/model --prompts 256 --n 4

Then it sets the decode loop's median run against this machine's limits for the model
(benchmarks/roofline.py), and with `--profile` shows where one run's time goes, op by op.

The model defaults to the newest `cold_start_sft/model` under `--state`, and the prompts to the
held-out questions of that run (rendered with the chat template). The defaults for temperature,
top-p, length and batch size are the tiny profile's evaluation settings.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from benchmarks.roofline import Shapes, decode_work, limits, report  # noqa: E402
from models.chat import render_prompt  # noqa: E402
from models.loading import load_model, load_tokenizer  # noqa: E402
from problems.loader import load_problems  # noqa: E402
from sampling.hf import HFSampler  # noqa: E402
from sampling.interface import Completion, SamplingParams  # noqa: E402
from sampling.reference import GenerateSampler  # noqa: E402

Generate = Callable[[list[str], int, SamplingParams], list[list[Completion]]]


def find_model(state: Path) -> Path:
    found = sorted(state.glob("runs/cold_start_sft/*/model/config.json"), key=os.path.getmtime)
    if not found:
        raise SystemExit(f"no cold_start_sft model under {state}/runs: pass --model")
    return found[-1].parent


def find_heldout(model_path: Path) -> Path:
    """The newest held-out problem file of the state folder `model_path` lies in
    (`runs/<stage>/<key>/model`)."""
    runs = model_path.resolve().parents[2]
    found = sorted(runs.glob("problems/*/heldout.jsonl"), key=os.path.getmtime)
    if not found:
        raise SystemExit(f"no held-out problems under {runs}/problems: pass --problems")
    return found[-1]


def load_prompts(args: argparse.Namespace, model_path: Path, tokenizer) -> list[str]:
    path = args.problems or find_heldout(model_path)
    problems = load_problems(path, limit=args.prompts)
    return [render_prompt(tokenizer, p.question) for p in problems]


def timed(generate: Generate, prompts: list[str], n: int, params: SamplingParams):
    """Wall seconds, process CPU seconds, completion tokens and the completions of one run."""
    wall, cpu = time.perf_counter(), time.process_time()
    groups = generate(prompts, n, params)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tokens = sum(len(c.token_ids) for group in groups for c in group)
    return wall, cpu, tokens, groups


def summary(groups: list[list[Completion]]) -> str:
    flat = [c for group in groups for c in group]
    stops = sum(c.finish_reason == "stop" for c in flat) / len(flat)
    mean_len = sum(len(c.token_ids) for c in flat) / len(flat)
    return f"mean length {mean_len:.1f} tokens, stop rate {stops:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--state", type=Path, default=Path("state"))
    parser.add_argument("--problems", type=Path, default=None, help="default: the run's held-out")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=128, help="old sampler's batch")
    parser.add_argument("--new-batch-size", type=int, default=None, help="default: --batch-size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--profile", action="store_true", help="also profile one decode-loop run, ops by time"
    )
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model_path = args.model or find_model(args.state)
    tokenizer = load_tokenizer(model_path)
    model = load_model(model_path).eval()
    prompts = load_prompts(args, model_path, tokenizer)
    params = SamplingParams(args.temperature, args.top_p, args.max_new_tokens, args.seed)
    samplers: dict[str, Generate] = {
        "generate": GenerateSampler(model, tokenizer, batch_size=args.batch_size).generate,
        "decode loop": HFSampler(
            model, tokenizer, batch_size=args.new_batch_size or args.batch_size, show_progress=False
        ).generate,
        "model forward": HFSampler(
            model,
            tokenizer,
            batch_size=args.new_batch_size or args.batch_size,
            show_progress=False,
            plain_step=False,
        ).generate,
    }
    print(
        f"model {model_path}, {len(prompts)} prompts x {args.n}, T={args.temperature}, "
        f"top_p={args.top_p}, max_new_tokens={args.max_new_tokens}, batch {args.batch_size} / "
        f"{args.new_batch_size or args.batch_size}, {torch.get_num_threads()} threads"
    )
    seconds: dict[str, list[float]] = {name: [] for name in samplers}
    decoded: list[list[Completion]] = []
    names = list(samplers)
    for repeat in range(args.repeats):
        turn = repeat % len(names)  # who goes first turns, so drifting load falls on all
        for name in names[turn:] + names[:turn]:
            wall, cpu, tokens, groups = timed(samplers[name], prompts, args.n, params)
            seconds[name].append(wall)
            if name == "decode loop":
                decoded = groups
            print(
                f"  repeat {repeat + 1} {name:>13}: {wall:7.2f} s ({cpu:7.2f} s CPU)  "
                f"{tokens / wall:7.0f} tokens/s  ({summary(groups)})",
                flush=True,
            )
    for name, runs in seconds.items():
        print(f"{name:>13}: best {min(runs):.2f} s, median {statistics.median(runs):.2f} s")
    ours = seconds["decode loop"]
    for peer in ("generate", "model forward"):
        ratios = [theirs / mine for theirs, mine in zip(seconds[peer], ours, strict=True)]
        best = min(seconds[peer]) / min(ours)
        print(
            f"speed-up ({peer} / decode loop): {statistics.median(ratios):.2f}x median of the "
            f"{len(ratios)} side-by-side runs, {best:.2f}x best against best"
        )
    print_roofline(
        model, tokenizer, prompts, decoded, statistics.median(seconds["decode loop"]), args
    )
    if args.profile:
        print_profile(samplers["decode loop"], prompts, args.n, params)


def print_profile(generate: Generate, prompts: list[str], n: int, params: SamplingParams) -> None:
    """One decode-loop run under torch's profiler: where its time goes, op by op."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        generate(prompts, n, params)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def print_roofline(model, tokenizer, prompts, groups, seconds: float, args) -> None:
    """The decode loop's median run against what this machine can do for this model
    (benchmarks/roofline.py), measured here, now."""
    shapes = Shapes.of(model.config)
    prompt_lengths = [len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    work = decode_work(shapes, prompt_lengths, [[len(c.token_ids) for c in g] for g in groups])
    machine = limits(shapes, rows=args.new_batch_size or args.batch_size)
    print(f"decode loop against this machine's limits ({torch.get_num_threads()} threads):")
    for line in report(work, seconds, machine):
        print(f"  {line}")


if __name__ == "__main__":
    main()
