"""ZeRO-2's bf16 update with DeepSpeed's overflow scan, and without it (the norm checked once).

    python -m benchmarks.overflow_scan                    # CPU: a thin model, host work only
    python -m benchmarks.overflow_scan --device cuda      # the same on a GPU

DeepSpeed 0.19's bf16 ZeRO-2 step first scans every gradient for NaN and infinity (two
reductions each, summed on the device, one read-back), then computes the global norm for
clipping (one norm per gradient) and reads it back to test it again. `engine.overflow_scan:
false` drops the scan and keeps one read-back of the norm (training/finite.py). A model of 24
layers of width 64 in bf16 (290 parameters, as Qwen2.5-0.5B has; the compute negligible), two
engines side by side on a world of one, one with the scan and one without: each round, each
engine takes a forward and backward pass (untimed) and its `step` (timed, the device
synchronised before and after), alternating. Prints each engine's median and quartiles of the
step's time, their ratio, and each engine's gradient norms (equal: the same model, the same rows).
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


def engine_of(scan: bool, device: str):
    from training.engines import DeepSpeedEngine

    config = EngineConfig(
        kind="deepspeed", processes=1, zero_stage=2, precision="bf16", bucket_size=2e8,
        overflow_scan=scan,
    )  # fmt: skip
    with torch.device(device):
        model = build_model(THIN, 1024, 0, 1, seed=0)
    return DeepSpeedEngine(model, 1e-5, 1.0, config, world=1)


def timed_step(engine, ids: torch.Tensor, device: str) -> tuple[float, float]:
    """One forward and backward pass, then the timed update: (seconds, gradient norm)."""
    out = engine.forward_model(input_ids=ids, labels=ids)
    engine.backward(out.loss)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    norm = engine.step(LossGuard("overflow scan"))
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, norm


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--steps", type=int, default=60, help="timed steps per engine")
    args = p.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from benchmarks.gpu_check import start_rank

    start_rank(args.device)
    engines = {"scan": engine_of(True, args.device), "norm": engine_of(False, args.device)}
    params = sum(1 for _ in engines["scan"].module.parameters())
    ids = torch.randint(2, 1024, (4, 64), generator=torch.Generator().manual_seed(0))
    ids = ids.to(args.device)
    times: dict[str, list[float]] = {name: [] for name in engines}
    norms: dict[str, list[float]] = {name: [] for name in engines}
    for step in range(args.steps + 2):  # two untimed warm-up rounds
        for name, engine in engines.items():
            seconds, norm = timed_step(engine, ids, args.device)
            if step >= 2:
                times[name].append(seconds)
                norms[name].append(norm)
    print(f"ZeRO-2 bf16, world of one, {args.device}, {params} parameters, {args.steps} steps each")
    for name, values in times.items():
        q1, median, q3 = statistics.quantiles(values, n=4)
        label = "DeepSpeed's overflow scan" if name == "scan" else "no scan, the norm checked"
        print(f"  {label:28s} step {median * 1e3:7.2f} ms (quartiles {q1 * 1e3:.2f}-"
              f"{q3 * 1e3:.2f}), last gradient norm {norms[name][-1]:.6f}")  # fmt: skip
    ratio = statistics.median(times["norm"]) / statistics.median(times["scan"])
    print(f"  no scan / scan: {ratio:.3f}x; gradient norms equal: {norms['scan'] == norms['norm']}")
    for engine in engines.values():
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
