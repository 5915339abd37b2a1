"""ZeRO-3 on a world of one with small parameters sharded (our setting) or kept whole.

    python -m benchmarks.zero3_persistence                 # CPU: a thin model, host work only
    python -m benchmarks.zero3_persistence --device cuda   # the same on a GPU

`stage3_param_persistence_threshold` keeps every parameter of fewer elements whole on each
rank: it is never gathered or released. Our DeepSpeed config sets it to 0 (training/engines.py);
DeepSpeed's default is 1e5. A model of 24 layers of width 64 (every parameter under 1e5, so all
kept whole at 1e5) takes SFT steps whose compute is negligible, so a step's time is the host's
work around it: DeepSpeed's hooks, the gathers, our stepper. Each threshold runs `--runs` times,
alternating, each run on a fresh engine: one untimed step, then `--steps` timed; prints each
run's median step time and the loss, equal across thresholds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import training.engines as engines
from benchmarks.memory_model import Case, engine_for, rows_of, tokenizer_for_cases
from configs.supervised import EngineConfig, ModelConfig, TrainConfig
from models.loading import build_model
from training.examples import Example
from training.supervised import SFTStepper

THIN = ModelConfig(
    hidden_size=64, num_layers=24, num_heads=4, num_kv_heads=2, intermediate_size=128
)


def step_times(threshold: float, steps: int, device: str) -> tuple[float, float]:
    """The median step time of a fresh ZeRO-3 engine at `threshold`, and its last loss."""
    plain = engines.deepspeed_config

    def config(*args, **kwargs):
        out = plain(*args, **kwargs)
        out["zero_optimization"]["stage3_param_persistence_threshold"] = threshold
        return out

    precision = "bf16" if device == "cuda" else "fp32"
    engine_config = EngineConfig(kind="deepspeed", processes=1, zero_stage=3, precision=precision)
    case = Case("thin", THIN, 1024, "sft", 4, 16, 16, engine=engine_config)
    tokenizer = tokenizer_for_cases()
    torch.manual_seed(0)
    with torch.device(device):
        model = build_model(THIN, case.vocab, tokenizer.pad_token_id, tokenizer.eos_token_id, 0)
    examples = [Example(p + c, [-100] * len(p) + c) for p, c in rows_of(case, tokenizer)]
    engines.deepspeed_config = config
    try:
        engine = engine_for(case, model, 1e-4)
    finally:
        engines.deepspeed_config = plain
    try:
        cfg = TrainConfig(batch_size=case.rows, epochs=steps + 2, warmup_steps=0)
        stepper = SFTStepper(engine, examples, cfg, tokenizer.pad_token_id, "zero-3",
                             memory=engine_config)  # fmt: skip
        stepper.start(0)
        stepper.run_step(1)
        times, metrics = [], {}
        for i in range(2, steps + 2):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            metrics = stepper.run_step(i)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times), float(metrics["train/loss"])
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.0, 1e5])
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args(argv)
    for run in range(1, args.runs + 1):
        for threshold in args.thresholds:
            median, loss = step_times(threshold, args.steps, args.device)
            print(f"run {run}  threshold {threshold:>8g}  median step {median * 1e3:7.1f} ms  "
                  f"loss {loss:.6f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
