"""Run by tests/training/test_deepspeed_finite.py in a process of its own (DeepSpeed needs a
torch.distributed group): ZeRO-2 (and ZeRO-1) engines on a world of one on CPU, each case a
fresh engine.

- `nan:<precision>:<check>`: one good step, then a NaN gradient under a finite loss; prints
  whether the step raised, and whether the weights, the fp32 master weights and the optimizer's
  step count are as before and finite. `<check>` is `scan` (DeepSpeed's overflow scan),
  `norm` (the scan off, training/finite.py's check of the norm), `none` (the scan off and
  nothing in its place: what DeepSpeed alone does then) or `zero1` (ZeRO-1's BF16_Optimizer,
  which checks the norm only).
- `sum:bf16:<check>`: the fp32 sum of three micro-batches' bf16 gradients against what AdamW
  is handed (`sum_case`).
- `small:<precision>:<check>`: 100 AdamW steps of learning rate 1e-6 on weights of 0.02, far
  below half a bf16 step there (6.1e-5); prints how far the fp32 masters and the weights moved.

Prints `RESULT <json>` by case."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

from benchmarks.gpu_check import start_rank  # noqa: E402
from configs.supervised import EngineConfig  # noqa: E402
from training.engines import DeepSpeedEngine  # noqa: E402
from training.finite import LossGuard, NonFiniteLossError  # noqa: E402


def _engine(model: torch.nn.Module, lr: float, clip: float, precision: str, check: str):
    config = EngineConfig(
        kind="deepspeed", processes=1, zero_stage=1 if check == "zero1" else 2,
        precision=precision, overflow_scan=check in ("scan", "zero1"),
    )  # fmt: skip
    engine = DeepSpeedEngine(model, lr, clip, config, world=1)
    if check == "none":  # DeepSpeed's own norm back, unchecked
        del engine.engine.optimizer.scaled_global_norm
    return engine


def _step(engine: DeepSpeedEngine, x: torch.Tensor) -> float:
    dtype = next(engine.module.parameters()).dtype
    engine.backward(engine.forward_model(x.to(dtype)).pow(2).sum())
    return engine.step(LossGuard("finite check"))


def _state(engine: DeepSpeedEngine) -> dict[str, list]:
    from deepspeed.utils import safe_get_full_fp32_param

    params = list(engine.module.parameters())
    inner = engine.engine.optimizer.optimizer  # AdamW over the fp32 partitions
    return {
        "weights": [p.detach().float().flatten().tolist() for p in params],
        "masters": [safe_get_full_fp32_param(p).flatten().tolist() for p in params],
        "steps": sorted(float(s["step"]) for s in inner.state.values()),
    }


def nan_case(precision: str, check: str) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    engine = _engine(model, 1e-2, 1.0, precision, check)
    x = torch.randn(6, 4)
    _step(engine, x)
    before = _state(engine)
    first = engine.module[0].weight
    hook = first.register_hook(lambda grad: grad * float("nan"))
    dtype = first.dtype
    loss = engine.forward_model(x.to(dtype)).pow(2).sum()
    raised = None
    try:
        engine.backward(loss)
        engine.step(LossGuard("finite check"))
    except NonFiniteLossError as error:
        raised = str(error)
    hook.remove()
    after = _state(engine)
    engine.close()
    finite = all(torch.isfinite(torch.tensor(w)).all() for w in after["weights"])
    return {
        "loss_finite": bool(torch.isfinite(loss)),
        "raised": raised,
        "weights_kept": after["weights"] == before["weights"],
        "masters_kept": after["masters"] == before["masters"],
        "steps_kept": after["steps"] == before["steps"],
        "weights_finite": bool(finite),
    }


def _moved(start: list[float], end: list[float]) -> list[float]:
    return [a - b for a, b in zip(start, end, strict=True)]


def small_case(precision: str, check: str) -> dict:
    layer = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(0.02)
    engine = _engine(layer, 1e-6, 1e9, precision, check)
    x = torch.ones(1, 4)
    start = _state(engine)
    for _ in range(100):
        _step(engine, x)
    end = _state(engine)
    dtype = str(next(engine.module.parameters()).dtype)
    engine.close()
    return {
        "master_moved": _moved(start["masters"][0], end["masters"][0]),
        "weight_moved": _moved(start["weights"][0], end["weights"][0]),
        "dtype": dtype,
    }


def sum_case(precision: str, check: str) -> dict:
    """Three micro-batches' bf16 gradients, added up in fp32 by a bf16 copy of the model outside
    DeepSpeed, against what the engine hands AdamW at the step (no clipping): ZeRO-1 (`zero1`),
    ZeRO-1 with DeepSpeed's default all-reduce in bf16, which runs on a world of one too
    (`zero1-default`), and ZeRO-2 (`scan`)."""
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    reference = copy.deepcopy(model).to(torch.bfloat16)
    engine = _engine(model, 1e-3, 1e9, precision, "zero1" if "zero1" in check else check)
    if check == "zero1-default":
        engine.engine.communication_data_type = torch.bfloat16
        engine.engine.enable_backward_allreduce = True
    summed = [torch.zeros(p.shape) for p in reference.parameters()]
    for rows in torch.randn(3, 32, 64, dtype=torch.bfloat16):
        reference.zero_grad()
        reference(rows).pow(2).sum().backward()
        for total, param in zip(summed, reference.parameters(), strict=True):
            total.add_(param.grad.float())
        engine.backward(engine.forward_model(rows).pow(2).sum())
    expected = torch.cat([total.flatten() for total in summed])
    inner = engine.engine.optimizer.optimizer  # AdamW over the fp32 partition
    applied: list[torch.Tensor] = []
    step = inner.step

    def recording(*args, **kwargs):
        grads = [p.grad.flatten() for group in inner.param_groups for p in group["params"]]
        applied.append(torch.cat(grads)[: expected.numel()].clone())
        return step(*args, **kwargs)

    inner.step = recording
    engine.step(LossGuard("finite check"))
    engine.close()
    return {
        "sum_needs_fp32": not torch.equal(expected, expected.bfloat16().float()),
        "applied_is_the_sum": torch.equal(applied[0], expected),
        "applied_in_bf16": torch.equal(applied[0], applied[0].bfloat16().float()),
    }


def main(cases: list[str]) -> None:
    start_rank("cpu")
    out = {}
    for case in cases:
        kind, precision, check = case.split(":")
        run = {"nan": nan_case, "small": small_case, "sum": sum_case}[kind]
        out[case] = run(precision, check)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
