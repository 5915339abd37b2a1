"""Pushing a trainer's current weights into a live inference engine, a bounded chunk at a time.

GRPO samples from pi_old, so an engine that generates for a trainer (vLLM, colocated in the
trainer's process as TRL's colocate mode does) must hold the weights of the last update before
every step's sampling. Saving a checkpoint and restarting the engine would cost minutes per
step; instead the trainer's parameters are handed to the engine's `load_weights`, which copies
each into the engine's own (sharded, fused, lower-precision) layout.

The pure part lives here and runs without vLLM:
- names: the trainer's parameter names as a Hugging Face checkpoint spells them, which is what
  vLLM's `load_weights` reads; wrappers' segments (`module.` of DeepSpeed/DDP, `_orig_mod.` of
  torch.compile, activation-checkpoint and FSDP wrappers) are removed;
- tied embeddings: a model whose LM head is the input embedding (small Qwen2 models) yields the
  shared tensor once, as `model.embed_tokens.weight`; vLLM's Qwen2/Llama `load_weights` skip
  `lm_head.*` when `tie_word_embeddings` is set, and read the head from the embedding;
- chunks: parameters are handed over in chunks of at most `budget` bytes, so nothing ever holds
  a second whole copy of the model (under ZeRO-3 only one chunk is gathered at a time);
- gathering: a pluggable step that makes a chunk's parameters whole. Single-process and ZeRO-1/2
  parameters are already whole (`no_gather`); ZeRO-3 parameters are partitioned across ranks
  and are gathered with `deepspeed.zero.GatheredParameters`, a collective every rank enters.

What a load does with the tensors is the engine's business (sampling/vllm.py); after the last
chunk the engine's prefix cache is reset, since KV blocks cached under the old weights are
stale.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

log = logging.getLogger(__name__)

# Segments that wrappers insert into parameter names; none is part of a checkpoint's names.
WRAPPER_SEGMENTS = ("module", "_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")
DEFAULT_BUDGET = 256 * 2**20  # bytes of weights per load call

Named = list[tuple[str, torch.nn.Parameter]]
Gather = Callable[[Sequence[torch.nn.Parameter]], AbstractContextManager[object]]
Load = Callable[[list[tuple[str, torch.Tensor]]], None]


class WeightSyncError(RuntimeError):
    """Weights that cannot be handed over as they are (a name twice, a partitioned tensor)."""


@dataclass(frozen=True)
class SyncReport:
    version: int  # syncs done so far, this one included
    seconds: float
    bytes: int  # of weights handed over, in the trainer's dtype
    tensors: int
    chunks: int
    largest_chunk_bytes: int

    def metrics(self) -> dict[str, float]:
        return {
            "sync/seconds": self.seconds,
            "sync/megabytes": self.bytes / 2**20,
            "sync/version": float(self.version),
        }


@runtime_checkable
class SyncsWeights(Protocol):
    """A sampler whose engine holds its own copy of the weights and must be told of updates."""

    def sync_weights(self, model: torch.nn.Module) -> SyncReport: ...


def engine_name(name: str) -> str:
    """`module._orig_mod.model.layers.0.mlp.up_proj.weight` -> `model.layers.0.mlp.up_proj.weight`.

    A leading `module` is a wrapper's (DeepSpeed, DDP); the private wrapper segments are removed
    wherever they are. A `module` further in is left alone: it may be a real submodule's name.
    """
    parts = name.split(".")
    while parts and parts[0] == "module":
        parts = parts[1:]
    return ".".join(p for p in parts if p not in WRAPPER_SEGMENTS[1:])


def _config(model: torch.nn.Module) -> object | None:
    """The transformers config of `model`, or of the model inside its wrappers."""
    inner: object | None = model
    for _ in range(8):
        config = getattr(inner, "config", None)
        if config is not None or inner is None:
            return config
        wrapped = getattr(inner, "module", None)  # not `or`: a module may define __len__
        inner = wrapped if wrapped is not None else getattr(inner, "_orig_mod", None)
    return None


def tied_embeddings(model: torch.nn.Module) -> bool:
    return bool(getattr(_config(model), "tie_word_embeddings", False))


def engine_weights(model: torch.nn.Module) -> Named:
    """The parameters to hand over, under checkpoint names: each tensor once (named_parameters
    drops repeats of a shared tensor), the LM head left out when it is tied to the embedding."""
    tied = tied_embeddings(model)
    named: Named = []
    seen: set[str] = set()
    for raw, param in model.named_parameters():
        name = engine_name(raw)
        if tied and name.startswith("lm_head."):
            continue  # the same tensor as model.embed_tokens.weight, which vLLM reads for both
        if name in seen:
            raise WeightSyncError(f"two parameters are both named {name!r} once unwrapped")
        seen.add(name)
        named.append((name, param))
    return named


def full_shape(param: torch.nn.Parameter) -> torch.Size:
    """The whole tensor's shape; a ZeRO-3 parameter holds only its shard (DeepSpeed keeps the
    whole shape in `ds_shape`)."""
    return torch.Size(getattr(param, "ds_shape", param.shape))


def full_bytes(param: torch.nn.Parameter) -> int:
    return int(getattr(param, "ds_numel", param.numel())) * param.element_size()


def chunks(named: Named, budget: int = DEFAULT_BUDGET) -> Iterator[Named]:
    """Consecutive parameters in chunks of at most `budget` bytes of whole weights; a parameter
    larger than the budget is a chunk of its own."""
    chunk: Named = []
    size = 0
    for name, param in named:
        nbytes = full_bytes(param)
        if chunk and size + nbytes > budget:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, param))
        size += nbytes
    if chunk:
        yield chunk


def no_gather(params: Sequence[torch.nn.Parameter]) -> AbstractContextManager[object]:
    """Whole parameters (one process, ZeRO-1/2): nothing to do."""
    return contextlib.nullcontext()


def zero3_gather(params: Sequence[torch.nn.Parameter]) -> AbstractContextManager[object]:
    """ZeRO-3: the chunk's shards all-gathered into whole tensors on every rank for the block,
    and released after it. Every rank must enter (it is a collective); nothing is modified."""
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(params), modifier_rank=None)


def gather_for(model: torch.nn.Module) -> Gather:
    """ZeRO-3's gather when the parameters are partitioned (DeepSpeed tags them `ds_id`)."""
    partitioned = any(hasattr(p, "ds_id") for p in model.parameters())
    return zero3_gather if partitioned else no_gather


class WeightSync:
    """Hands a model's weights to an engine (`load`, one call per chunk), then `after_sync`
    (the engine's prefix-cache reset); counts syncs as versions and logs time and bytes."""

    def __init__(
        self,
        load: Load,
        budget: int = DEFAULT_BUDGET,
        after_sync: Callable[[], object] | None = None,
    ):
        self.load = load
        self.budget = budget
        self.after_sync = after_sync
        self.version = 0

    def sync(self, model: torch.nn.Module, gather: Gather | None = None) -> SyncReport:
        gather = gather or gather_for(model)
        began = time.perf_counter()
        total = largest = tensors = n_chunks = 0
        with torch.no_grad():
            for chunk in chunks(engine_weights(model), self.budget):
                with gather([p for _, p in chunk]):
                    weights = [(name, whole(name, p)) for name, p in chunk]
                    self.load(weights)
                nbytes = sum(full_bytes(p) for _, p in chunk)
                total, largest = total + nbytes, max(largest, nbytes)
                tensors, n_chunks = tensors + len(chunk), n_chunks + 1
        if self.after_sync is not None:
            self.after_sync()
        self.version += 1
        report = SyncReport(
            self.version, time.perf_counter() - began, total, tensors, n_chunks, largest
        )
        log.info(
            "weight sync %d: %d tensors, %.1f MiB in %d chunks, %.2f s",
            report.version,
            tensors,
            total / 2**20,
            n_chunks,
            report.seconds,
        )
        return report


def whole(name: str, param: torch.nn.Parameter) -> torch.Tensor:
    """The parameter's tensor, checked to be whole: a shard here means the gather step was
    skipped, and loading it would corrupt the engine's weights."""
    tensor = param.detach()
    if tensor.shape != full_shape(param):
        raise WeightSyncError(
            f"{name}: holds shape {tuple(tensor.shape)} but the whole tensor is "
            f"{tuple(full_shape(param))}; partitioned (ZeRO-3) parameters must be gathered first"
        )
    return tensor
