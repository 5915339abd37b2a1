"""The chunked head eager and fused (training/fused_head.py), side by side on this machine.

    python -m benchmarks.fused_head                                   # CPU: a small head
    python -m benchmarks.fused_head --device cuda --positions 16384 --hidden 896 \
        --vocab 151936 --dtype bf16                                   # a 0.5B micro-batch

For SFT's cross-entropy (`chunked_nll`) and GRPO's log-probabilities with entropies
(`chunked_token_logprobs`), the forward and backward pass of the head over `--positions` hidden
states in chunks of `--chunk-mb` float32 logits, eager then fused, alternating, `--repeats`
times after one untimed call of each (the fused one compiles there); prints the median of each,
their ratio, and the largest difference of the loss and the hidden states' gradient between
the two. On a GPU the peak memory of each is printed too.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from training.logits import chunk_positions, chunked_nll, chunked_token_logprobs

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--positions", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--chunk-mb", type=float, default=32.0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    if min(args.positions, args.hidden, args.vocab, args.repeats) < 1 or args.chunk_mb <= 0:
        p.error("sizes, repeats and --chunk-mb must be positive")
    return args


def synchronized(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def head_pass(loss: str, head, hidden, targets, chunk: int, fused: bool) -> Callable[[], tuple]:
    """One forward and backward pass of the chunked head; returns the loss and the hidden
    states' gradient."""

    def run() -> tuple[float, torch.Tensor]:
        h = hidden.detach().requires_grad_()
        if loss == "sft":
            value = chunked_nll(head, h, targets, chunk, fused=fused)
        else:
            logp, _ = chunked_token_logprobs(head, h, targets, 1.0, True, chunk, fused=fused)
            value = logp.sum()
        value.backward()
        head.weight.grad = None
        return float(value.detach()), h.grad

    return run


def timed(device: torch.device, run: Callable[[], tuple]) -> tuple[float, tuple, int]:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronized(device)
    start = time.perf_counter()
    out = run()
    synchronized(device)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return time.perf_counter() - start, out, peak


def compare(args: argparse.Namespace, loss: str) -> None:
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    torch.manual_seed(0)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False, device=device, dtype=dtype)
    hidden = torch.randn(args.positions, args.hidden, device=device, dtype=dtype)
    targets = torch.randint(0, args.vocab, (args.positions,), device=device)
    chunk = chunk_positions(int(args.chunk_mb * 2**20 / 4), args.vocab)
    runs = {fused: head_pass(loss, head, hidden, targets, chunk, fused) for fused in (False, True)}
    seconds: dict[bool, list[float]] = {False: [], True: []}
    outs, peaks = {}, {}
    for fused in (False, True):
        outs[fused] = runs[fused]()  # untimed: the fused one compiles here
    for _ in range(args.repeats):
        for fused in (False, True):
            elapsed, outs[fused], peaks[fused] = timed(device, runs[fused])
            seconds[fused].append(elapsed)
    eager, fused = statistics.median(seconds[False]), statistics.median(seconds[True])
    loss_gap = abs(outs[True][0] - outs[False][0]) / max(abs(outs[False][0]), 1e-12)
    grad_gap = float((outs[True][1].float() - outs[False][1].float()).abs().max())
    memory = ""
    if device.type == "cuda":
        memory = f"  peak {peaks[False] / 2**30:.2f} / {peaks[True] / 2**30:.2f} GiB"
    print(f"{loss:4} eager {eager * 1e3:9.1f} ms  fused {fused * 1e3:9.1f} ms  "
          f"fused/eager {fused / eager:5.2f}x  tokens/s {args.positions / eager:,.0f} -> "
          f"{args.positions / fused:,.0f}  loss rel. diff {loss_gap:.1e}  "
          f"max grad diff {grad_gap:.1e}{memory}", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    chunk = chunk_positions(int(args.chunk_mb * 2**20 / 4), args.vocab)
    print(f"head {args.hidden} x {args.vocab}, {args.positions} positions in chunks of {chunk}, "
          f"{args.dtype} on {args.device}, median of {args.repeats}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)  # fmt: skip
    for loss in ("sft", "grpo"):
        compare(args, loss)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
