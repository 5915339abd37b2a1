"""Sampling from a ZeRO-3 model: a whole copy gathered once per generate call when it fits, the
shards themselves (a layer gathered at a time, every forward) when it does not.

Decoding through ZeRO-3's hooks gathers every layer's shards at every step of every sequence:
on one H100 our sampler ran at 155-1,251 tokens/s that way against 12,134 on a whole ZeRO-2
model. A whole copy in the compute dtype costs the model's weights once (1 GB for a 0.5B model
in bf16) for the length of a generate call; the memory model (training/memory.py
`sampling_bytes`) says whether the copy, its KV cache and logits fit the device's free memory.
Every rank decides together (the copy is gathered by all of them), and then decodes alone:
with a whole copy no forward is a collective.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, Literal

import torch

from training.collective import Collective
from training.memory import ModelShape, sampling_bytes

log = logging.getLogger(__name__)

ZeRO3Sampling = Literal["auto", "gathered", "shards"]
GATHER_ELEMENTS = 50_000_000  # parameters gathered at once while the copy is made
FREE_SHARE = 0.9  # of the device's free memory a copy may plan to use


def free_device_bytes(device: torch.device) -> int | None:
    """Free memory on `device` (None on the CPU: the host's is not the limit worth checking)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free + cached)  # torch's cache hands its free blocks out first


def all_ranks_agree(flag: bool, device: torch.device) -> bool:
    """`flag` on every rank of torch.distributed's group (True only if it holds on all)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return flag
    backend = torch.distributed.get_backend()
    on = device if backend == "nccl" else torch.device("cpu")
    value = torch.tensor([1 if flag else 0], device=on)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MIN)
    return bool(value.item())


def copy_fits(module: torch.nn.Module, rows: int, context: int, prompt: int) -> bool:
    """Whether a whole copy of `module` and a generate call of `rows` sequences of up to
    `context` tokens (`prompt` of them prefilled) fit the device's free memory."""
    param = next(module.parameters())
    free = free_device_bytes(param.device)
    if free is None:
        return True
    shape = ModelShape.from_config(module.config.to_dict())
    need = sampling_bytes(shape, rows, context, prompt, param.element_size())
    return need <= FREE_SHARE * free


def whole_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A plain copy of ZeRO-3 `module` on its device, in its dtype, in eval mode with no
    gradients: built on the meta device, then filled a bucket of gathered parameters at a time
    (every rank must call it together), buffers copied as they are (they are not sharded)."""
    import deepspeed

    param = next(module.parameters())
    with torch.device("meta"):
        copy = type(module)(module.config)
    copy = copy.to(dtype=param.dtype).to_empty(device=param.device)
    copy.tie_weights()  # leaving the meta device made the tied head a parameter of its own
    targets = dict(copy.named_parameters())
    names = {name for name, _ in module.named_parameters()}
    if names != targets.keys():
        raise ValueError(
            f"a whole copy of {type(module).__name__} does not have its parameters: "
            f"{sorted(names ^ targets.keys())[:4]}"
        )
    bucket: list[tuple[str, torch.nn.Parameter]] = []
    size = 0
    for name, source in module.named_parameters():
        bucket.append((name, source))
        size += source.ds_numel
        if size >= GATHER_ELEMENTS:
            _fill(bucket, targets, deepspeed)
            bucket, size = [], 0
    _fill(bucket, targets, deepspeed)
    copies = dict(copy.named_buffers())
    with torch.no_grad():
        for name, buffer in module.named_buffers():
            copies[name].copy_(buffer)
    copy.eval()
    for p in copy.parameters():
        p.requires_grad_(False)
    return copy


def _fill(bucket, targets: dict[str, torch.nn.Parameter], deepspeed) -> None:
    if not bucket:
        return
    gathered = deepspeed.zero.GatheredParameters([p for _, p in bucket], modifier_rank=None)
    with gathered, torch.no_grad():
        for name, source in bucket:
            targets[name].copy_(source)


@contextmanager
def sampling_copy(
    module: torch.nn.Module, rows: int, context: int, prompt: int, mode: ZeRO3Sampling = "auto"
) -> Iterator[torch.nn.Module | None]:
    """A whole copy of ZeRO-3 `module` for one generate call, freed after it; None when the
    shards must be sampled from (`mode` "shards", or "auto" and the copy would not fit)."""
    device = next(module.parameters()).device
    wanted = mode == "gathered" or (mode == "auto" and copy_fits(module, rows, context, prompt))
    if not all_ranks_agree(wanted, device):
        if mode == "auto":
            log.info("sampling from ZeRO-3 shards: a whole copy would not fit the device")
        yield None
        return
    copy = whole_copy(module)
    try:
        yield copy
    finally:
        del copy
        if device.type == "cuda":
            torch.cuda.empty_cache()


def zero3_sampling(
    model: torch.nn.Module, collective: Collective, mode: ZeRO3Sampling
) -> dict[str, Any]:
    """The hf sampler's options for a trainer's model (sampling/hf.py): nothing for a whole
    model; for ZeRO-3 shards, a whole copy per generate call (`sampling_copy`) and, for calls
    that must decode the shards, the ranks in step (every forward gathers a layer's shards, a
    collective, so each rank goes on until every rank's rows are done)."""
    if not any(hasattr(p, "ds_id") for p in model.parameters()):
        return {}
    return {
        "lockstep": lambda running: collective.max([float(running)])[0] > 0,
        "materialize": partial(sampling_copy, model, mode=mode),
    }
