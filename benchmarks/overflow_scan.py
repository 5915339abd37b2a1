"""ZeRO-2's bf16 update with DeepSpeed's overflow scan, without it (the norm checked once), and
ZeRO-1's BF16_Optimizer.

    python -m benchmarks.overflow_scan                    # CPU: a thin model, host work only
    python -m benchmarks.overflow_scan --device cuda      # the same on a GPU

DeepSpeed 0.19's bf16 ZeRO-2 step first scans every gradient for NaN and infinity (two
reductions each, summed on the device, one read-back), then computes the global norm for
clipping (one norm per gradient) and reads it back to test it again. `engine.overflow_scan:
false` drops the scan and keeps one read-back of the norm (training/finite.py). ZeRO-1 in bf16
(`engine.zero_stage: 1`) is DeepSpeed's BF16_Optimizer: each bf16 gradient is added to a flat
fp32 buffer as the backward pass makes it, and the update is one AdamW over one flat fp32 tensor,
the norm checked once. A model of 24 layers of width 64 in bf16 (290 parameters, as Qwen2.5-0.5B
has; the compute negligible), three engines side by side on a world of one: each round, each
engine takes a forward pass (untimed), its backward pass (timed: ZeRO's gradient hooks run in
it) and its `step` (timed), the device synchronised around each, alternating. Prints each
engine's median and quartiles of the backward pass and of the step, the ratio of their sum to
ZeRO-2 with the scan, and how far the gradient norms are from that engine's: at the first update
(the same model, the same rows) and over the run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.zero3_persistence import THIN
from configs.supervised import EngineConfig
from models.loading import build_model
from training.finite import LossGuard

ENGINES = {  # name: (ZeRO stage, DeepSpeed's overflow scan)
    "zero-2, scan": (2, True),
    "zero-2, norm checked": (2, False),
    "zero-1 (BF16_Optimizer)": (1, True),
}


def engine_of(stage: int, scan: bool, device: str):
    from training.engines import DeepSpeedEngine

    config = EngineConfig(
        kind="deepspeed", processes=1, zero_stage=stage, precision="bf16", bucket_size=2e8,
        overflow_scan=scan,
    )  # fmt: skip
    with torch.device(device):
        model = build_model(THIN, 1024, 0, 1, seed=0)
    return DeepSpeedEngine(model, 1e-5, 1.0, config, world=1)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_step(engine, ids: torch.Tensor, device: str) -> tuple[float, float, float]:
    """A forward pass, then the timed backward pass and update: (seconds of the backward pass,
    seconds of the update, gradient norm)."""
    out = engine.forward_model(input_ids=ids, labels=ids)
    _sync(device)
    start = time.perf_counter()
    engine.backward(out.loss)
    _sync(device)
    middle = time.perf_counter()
    norm = engine.step(LossGuard("overflow scan"))
    _sync(device)
    return middle - start, time.perf_counter() - middle, norm


def _quartiles(values: list[float]) -> str:
    q1, median, q3 = statistics.quantiles(values, n=4)
    return f"{median * 1e3:7.2f} ms ({q1 * 1e3:.2f}-{q3 * 1e3:.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--steps", type=int, default=60, help="timed steps per engine")
    args = p.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from benchmarks.gpu_check import start_rank

    start_rank(args.device)
    engines = {name: engine_of(*setting, args.device) for name, setting in ENGINES.items()}
    params = sum(1 for _ in next(iter(engines.values())).module.parameters())
    ids = torch.randint(2, 1024, (4, 64), generator=torch.Generator().manual_seed(0))
    ids = ids.to(args.device)
    backward: dict[str, list[float]] = {name: [] for name in engines}
    update: dict[str, list[float]] = {name: [] for name in engines}
    norms: dict[str, list[float]] = {name: [] for name in engines}
    for step in range(args.steps + 2):  # two untimed warm-up rounds
        for name, engine in engines.items():
            back, seconds, norm = timed_step(engine, ids, args.device)
            norms[name].append(norm)
            if step >= 2:
                backward[name].append(back)
                update[name].append(seconds)
    print(f"bf16, world of one, {args.device}, {params} parameters, {args.steps} steps each; "
          "median (quartiles)")  # fmt: skip
    print(f"  {'engine':25s} {'backward pass':>26s} {'update':>26s} {'sum / zero-2, scan':>19s}")
    first = next(iter(engines))

    def total(name: str) -> float:
        return statistics.median(backward[name]) + statistics.median(update[name])

    for name in engines:
        print(f"  {name:25s} {_quartiles(backward[name]):>26s} {_quartiles(update[name]):>26s} "
              f"{total(name) / total(first):18.3f}x")  # fmt: skip
    ratio = statistics.median(update["zero-2, norm checked"]) / statistics.median(update[first])
    print(f"  ZeRO-2's update without the scan / with it: {ratio:.3f}x")

    def spread(rounds: slice) -> float:
        return max(
            abs(a - b) / max(abs(b), 1e-30)
            for name in engines
            for a, b in zip(norms[name][rounds], norms[first][rounds], strict=True)
        )

    print(f"  gradient norms against zero-2, scan: first update (the same weights) "
          f"{spread(slice(0, 1)):.2e} relative; largest over the run (the weights apart by "
          f"each update's rounding) {spread(slice(None)):.2e}")  # fmt: skip
    for engine in engines.values():
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
