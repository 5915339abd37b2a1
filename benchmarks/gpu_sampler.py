"""Our HF sampler against transformers' static-cache compiled `generate`, on one GPU, same run.

    python -m benchmarks.gpu_sampler                       # Qwen2.5-0.5B's shape, 64 x 4 x 256
    python -m benchmarks.gpu_sampler --device cpu --shape tiny --max-new-tokens 16   # here

A random model of the shape (bf16 on a GPU) and the check's word-level tokenizer
(benchmarks/gpu_check.py) sample `--prompts` prompts x `--n` samples of up to `--max-new-tokens`
tokens at `--temperature` and `--top-p` (1 and 1: GRPO's draw), in one call of every row, each way:
- `forward`: our decode loop through transformers' forward (what a policy under a DeepSpeed
  engine decoded through before the plain-ops step ran there);
- `lean`: the plain-ops step over the growing, compacting cache;
- `static`: the plain-ops step over a static cache, as CUDA graphs on a GPU (the default there);
- `static-compiled`: the same, the step compiled by Inductor inside the graphs (its elementwise
  ops fused: sampling/static_decode.py `compiled_step`);
- `peer`: transformers' `generate` with a static cache, its forward compiled by torch.compile
  (transformers' own auto-compile; `top_k` off so that it samples the whole vocabulary as ours).
Each is called once to warm up (compiling, capturing) and once timed; the warm-up's seconds are
printed too. Tokens are the generated ones up to and including a stop token. It prints tokens/s
per way and each against the peer (with `--profile`, one more call of each under torch's
profiler: the device's busy time against the wall time), and writes them to `--out` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.gpu_check import SHAPES, word_tokenizer  # noqa: E402
from benchmarks.gpu_profile import profile_step, profile_text  # noqa: E402
from models.chat import generation_eos, render_prompt, stop_token_ids  # noqa: E402
from models.loading import build_model  # noqa: E402
from sampling.hf import HFSampler  # noqa: E402
from sampling.interface import SamplingParams  # noqa: E402

WAYS = ("forward", "lean", "static", "static-compiled", "peer")


@dataclass
class Run:
    way: str
    ok: bool = False
    seconds: float = 0.0
    warmup_seconds: float = 0.0
    tokens: int = 0
    error: str = ""
    profile: dict | None = None  # one more call under the profiler (--profile)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.ok and self.seconds else 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(device: torch.device, fn: Callable[[], int]) -> tuple[float, int]:
    _sync(device)
    start = time.perf_counter()
    tokens = fn()
    _sync(device)
    return time.perf_counter() - start, tokens


def prompts_for(tokenizer, count: int, words: int = 48) -> list[str]:
    """`count` distinct chat prompts of `words` words each (the GPU check's)."""
    return [
        render_prompt(tokenizer, " ".join(f"w{100 + 7 * i + j}" for j in range(words)))
        for i in range(count)
    ]


def ours(model, tokenizer, prompts: Sequence[str], n: int, max_new: int, way: str,
         sampling: tuple[float, float] = (1.0, 1.0)):  # fmt: skip
    """One call of our sampler over every row, decoding the `way` asked."""
    sampler = HFSampler(
        model, tokenizer, batch_size=len(prompts) * n, show_progress=False,
        plain_step=way != "forward", static=way.startswith("static"),
        compile_step=way == "static-compiled",
    )  # fmt: skip

    def call(tokens: int = max_new) -> int:
        out = sampler.generate(prompts, n, SamplingParams(*sampling, tokens, seed=0))
        return sum(len(c.token_ids) for group in out for c in group)

    return call


def peer(model, tokenizer, prompts: Sequence[str], n: int, max_new: int,
         sampling: tuple[float, float] = (1.0, 1.0)):  # fmt: skip
    """transformers' generate over a static cache, its decode forward compiled (on a GPU)."""
    encoded = tokenizer(list(prompts), add_special_tokens=False, return_tensors="pt",
                        padding=True, padding_side="left").to(model.device)  # fmt: skip
    stops = stop_token_ids(tokenizer, generation_eos(model))

    def call() -> int:
        with torch.inference_mode():
            out = model.generate(
                **encoded, do_sample=sampling[0] > 0, temperature=sampling[0] or None,
                top_p=sampling[1], top_k=0,
                max_new_tokens=max_new, min_new_tokens=0, num_return_sequences=n,
                cache_implementation="static", pad_token_id=tokenizer.pad_token_id,
                eos_token_id=stops,
            )  # fmt: skip
        new = out[:, encoded["input_ids"].shape[1] :]
        return int(generated_lengths(new, stops).sum())

    return call


def generated_lengths(new: torch.Tensor, stops: Sequence[int]) -> torch.Tensor:
    """Tokens each row generated (B, T): up to and including its first stop token."""
    stopped = torch.isin(new, torch.tensor(list(stops), device=new.device))
    first = torch.where(stopped.any(1), stopped.int().argmax(1) + 1, new.shape[1])
    return first


def run_way(way: str, model, tokenizer, args) -> Run:
    run = Run(way)
    prompts = prompts_for(tokenizer, args.prompts)
    sampling = (args.temperature, args.top_p)
    device = model.device
    try:
        if way == "peer":
            call = peer(model, tokenizer, prompts, args.n, args.max_new_tokens, sampling)
        else:
            call = ours(model, tokenizer, prompts, args.n, args.max_new_tokens, way, sampling)
        run.warmup_seconds, _ = _timed(device, call)
        run.seconds, run.tokens = _timed(device, call)
        run.ok = True
        if args.profile:
            run.profile = profile_step(device, call)
    except Exception as err:  # noqa: BLE001 - one way failing must not hide the others
        run.error = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=6)}"
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return run


def report(runs: list[Run]) -> str:
    peer_rate = next((r.rate for r in runs if r.way == "peer" and r.ok), 0.0)
    lines = [
        f"{'way':<15} {'tokens':>8} {'seconds':>8} {'tokens/s':>10} {'x peer':>7} {'warm-up s':>9}"
    ]
    for r in runs:
        if not r.ok:
            lines.append(f"{r.way:<15} FAILED {r.error.splitlines()[0]}")
            continue
        ratio = f"{r.rate / peer_rate:.2f}" if peer_rate else "-"
        lines.append(f"{r.way:<15} {r.tokens:>8} {r.seconds:>8.2f} {r.rate:>10,.0f} "
                     f"{ratio:>7} {r.warmup_seconds:>9.1f}")  # fmt: skip
    return "\n".join(lines)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0, help="below 1: the draw reads back")
    parser.add_argument("--profile", action="store_true", help="each way once more, profiled")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    spec, vocab = SHAPES[args.shape]
    tokenizer = word_tokenizer(vocab)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(spec, vocab, tokenizer.pad_token_id, tokenizer.eos_token_id, 0)
    model = model.to(device=device, dtype=dtype).eval()
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"{args.shape} on {name}: {args.prompts} prompts x {args.n} samples, "
          f"up to {args.max_new_tokens} tokens", flush=True)  # fmt: skip
    runs = []
    for way in args.ways:  # the results written after each way: a run cut short keeps them
        runs.append(run_way(way, model, tokenizer, args))
        print(report(runs).splitlines()[-1], flush=True)
        if runs[-1].profile is not None:
            print(f"         {profile_text(runs[-1].profile, runs[-1].seconds)}", flush=True)
        if args.out is not None:
            rows = [asdict(r) | {"tokens_per_s": r.rate} for r in runs]
            args.out.write_text(json.dumps(rows, indent=1))
    print(report(runs), flush=True)
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
