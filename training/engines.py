"""Where a trainer's gradient step runs: AdamW in this process, or a DeepSpeed ZeRO engine in each
of several worker processes. The trainer computes its loss the same way either way; the engine
owns the optimizer, the backward pass, clipping, the update and the checkpoint of both.

A data-parallel rank's loss is its share of the whole batch's loss (the ranks' losses add up to
it); DeepSpeed averages the ranks' gradients, so the DeepSpeed engine scales the loss by the
world size before its backward pass and the update equals the single-process one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from configs.supervised import EngineConfig
from host.durable import sync_file, sync_folder, sync_tree
from training.checkpoints import load_checkpoint, save_checkpoint
from training.finite import LossGuard, NonFiniteNorm, check_norm_before_update

log = logging.getLogger(__name__)


class UpdateEngine(Protocol):
    @property
    def forward_model(self) -> torch.nn.Module:
        """What the training forward pass calls (it may gather sharded weights)."""
        ...

    @property
    def module(self) -> torch.nn.Module:
        """The model itself: its mode, its weights to save."""
        ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self, guard: LossGuard) -> float:
        """Clip and apply the accumulated gradients; returns the gradient norm. A non-finite norm
        raises through `guard` before the update."""
        ...

    def learning_rate(self) -> float:
        """The learning rate of the next update (after the schedule, if any)."""
        ...

    def sampling_model(self) -> torch.nn.Module:
        """A model with whole weights to sample from in this process."""
        ...

    def after_update(self) -> None:
        """Bring `sampling_model()` up to date with the weights just updated."""
        ...

    def save(self, ckpt_dir: Path, state: dict[str, Any]) -> None:
        """Weights, optimizer and the trainer's `state` (which holds a `fingerprint`)."""
        ...

    def load(self, ckpt_dir: Path, fingerprint: str) -> dict[str, Any] | None:
        """Restore weights and optimizer from `ckpt_dir` and return the trainer's state, or None
        when there is no checkpoint of the run named by `fingerprint`."""
        ...


Schedule = Callable[[int], float]  # the learning rate's factor at each step (LambdaLR)


def enable_gradient_checkpointing(model: torch.nn.Module, reentrant: bool = False) -> None:
    """Each decoder layer recomputed in the backward pass (transformers' own, non-reentrant:
    it works under ZeRO-3 and with inputs that need no gradient). Active in training mode only:
    sampling in eval mode keeps its KV cache.

    `reentrant` (ZeRO-3): torch's re-entrant checkpoint, which reruns a layer's whole forward in
    the backward pass and back-propagates through it. The non-re-entrant one stops a
    recomputation as soon as the saved tensors it needs are back, by raising out of the layer's
    forward: the forward hooks after that point never run, and ZeRO-3's post-forward hooks are
    what pop the module stack its pre-forward hooks push (the stack grew every step) and release
    the parameters they gathered. Run to its end instead (`early_stop=False`), the recomputation
    releases the parameters that the layer's backward pass then needs. The re-entrant rerun is
    an ordinary forward pass with its own hooks, gathering and releasing as the first did."""
    kwargs = {"use_reentrant": reentrant}
    if hasattr(model, "activation_checkpointing_enable"):  # its name from transformers 5.2x on
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def compile_layers(model: torch.nn.Module) -> None:
    """torch.compile each decoder layer in place (regional compilation: the layers share one
    compiled graph, so the cost is one layer's compilation). The varlen and flex kernels get
    their row's bounds as arguments, found before the first layer (training/varlen.py), so a
    layer is one graph with no device sync in it; the per-sequence kernel (CPU's) breaks it."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    for layer in decoder.layers:
        layer.compile()


class LocalEngine:
    """AdamW in this process, with an optional learning-rate schedule; checkpoints through
    training.checkpoints."""

    def __init__(
        self,
        model: torch.nn.Module,
        learning_rate: float,
        max_grad_norm: float,
        weight_decay: float = 0.0,
        schedule: Schedule | None = None,
        gradient_checkpointing: bool = False,
    ):
        self._model = model
        if gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.max_grad_norm = max_grad_norm
        params = self._optimized()
        self.optimizer = torch.optim.AdamW(
            params, lr=learning_rate, weight_decay=weight_decay,
            fused=True if params[0].is_cuda else None,  # one kernel over the parameters on a GPU
        )  # fmt: skip
        self.scheduler = (
            torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule) if schedule else None
        )

    def _optimized(self) -> list[torch.nn.Parameter]:
        """What AdamW updates: the model's own parameters."""
        return list(self._model.parameters())

    @property
    def forward_model(self) -> torch.nn.Module:
        return self._model

    @property
    def module(self) -> torch.nn.Module:
        return self._model

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, guard: LossGuard) -> float:
        norm = guard.check(
            "gradient norm",
            torch.nn.utils.clip_grad_norm_(self._model.parameters(), self.max_grad_norm),
        )
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def learning_rate(self) -> float:
        if self.scheduler is not None:
            return self.scheduler.get_last_lr()[0]
        return self.optimizer.param_groups[0]["lr"]

    def sampling_model(self) -> torch.nn.Module:
        return self._model

    def after_update(self) -> None:
        return None

    def save(self, ckpt_dir: Path, state: dict[str, Any]) -> None:
        payload = {"model": self._model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.scheduler is not None:
            payload["scheduler"] = self.scheduler.state_dict()
        save_checkpoint(ckpt_dir, payload | state)

    def load(self, ckpt_dir: Path, fingerprint: str) -> dict[str, Any] | None:
        state = load_checkpoint(ckpt_dir, fingerprint)
        if state is None:
            return None
        self._model.load_state_dict(state.pop("model"))
        self.optimizer.load_state_dict(state.pop("optimizer"))
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state.pop("scheduler"))
        return state


def deepspeed_config(
    engine: EngineConfig, max_grad_norm: float, batch_size: int, micro_batch_size: int
) -> dict[str, Any]:
    """ZeRO at `engine.zero_stage` with `engine.bucket_size` buckets, in `engine.precision`, with
    the trainer's gradient clipping. The trainer owns the accumulation boundary
    (`managed_gradient_accumulation: false`): it runs as many backward passes as a step has
    micro-batches (training/micro.py), then one `step()`; the batch sizes are nominal.

    ZeRO-1 in bf16 (the only precision `EngineConfig` admits for it) is DeepSpeed's
    BF16_Optimizer: bf16 weights in one flat buffer, whole fp32 gradients in another, the fp32
    master weights and AdamW's moments sharded over the ranks; the fp32 gradients are
    all-reduced in fp32 at the step (on a world of one, not at all: `DeepSpeedEngine`); it
    scans no gradient, and on a non-finite global norm it skips the update, which
    `DeepSpeedEngine.step` turns into an error."""
    bucket = int(engine.bucket_size)
    zero: dict[str, Any] = {
        "stage": engine.zero_stage,
        "reduce_bucket_size": bucket,
        "allgather_bucket_size": bucket,
    }
    if engine.zero_stage == 3:
        # 0: every parameter is sharded, however small (DeepSpeed keeps those under 1e5 whole)
        zero.update(stage3_prefetch_bucket_size=bucket, stage3_param_persistence_threshold=0)
    config: dict[str, Any] = {
        "train_batch_size": batch_size,
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": engine.precision == "bf16"},
        "fp16": {"enabled": False},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if engine.precision == "bf16" and not engine.overflow_scan:  # the norm is checked instead
        config["bf16"]["check_grad_overflow"] = False  # (training/finite.py)
    if engine.precision == "bf16":  # micro-batches' gradients add up in fp32, not in bf16
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    if engine.zero_stage == 1:  # BF16_Optimizer: each bf16 gradient added to the fp32 ones and
        config["bf16"]["immediate_grad_update"] = True  # let go as soon as it is made
        # reduced as they were summed: by default DeepSpeed casts them to bf16 for the
        # all-reduce and back, which rounds the fp32 sum (on a world of one too)
        config["communication_data_type"] = "fp32"
    return config


def reference_config(engine: EngineConfig, world: int) -> dict[str, Any]:
    """A frozen model's DeepSpeed config (no optimizer): sharded like the policy under ZeRO-3,
    else whole on every rank (stage 0), in the policy's precision (TRL's `prepare_deepspeed`)."""
    stage = 3 if engine.zero_stage == 3 else 0
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        bucket = int(engine.bucket_size)
        zero.update(stage3_prefetch_bucket_size=bucket, stage3_param_persistence_threshold=0)
    return {
        "train_batch_size": world,
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": zero,
        "bf16": {"enabled": engine.precision == "bf16"},
        "steps_per_print": 2**31 - 1,
    }


class DeepSpeedEngine:
    """A DeepSpeed ZeRO-1/2/3 engine over `model` with AdamW, one per worker process.

    No rank keeps a whole copy of a ZeRO-3 model: a trainer samples from the sharded module
    itself (the hf sampler's ranks decode in step, each forward gathering a layer at a time) or
    syncs a vLLM engine from it through the chunked gather (sampling/weight_sync.py), and its
    reference is a frozen DeepSpeed engine sharded the same way (`frozen_reference`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        learning_rate: float,
        max_grad_norm: float,
        engine: EngineConfig,
        world: int,
        weight_decay: float = 0.0,
        schedule: Schedule | None = None,
        sizes: tuple[int, int] | None = None,
    ):
        """`sizes`: the global and per-rank batch sizes DeepSpeed is told (by default nominal
        ones: the trainer feeds the engine batches of its own)."""
        import deepspeed

        self.config = engine
        self.zero_stage = engine.zero_stage
        self.world = world
        if engine.gradient_checkpointing:
            enable_gradient_checkpointing(model, reentrant=engine.zero_stage == 3)
        if engine.compile:
            compile_layers(model)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=learning_rate, weight_decay=weight_decay,
            fused=True if _on_cuda() else None,  # one kernel over the fp32 partition on a GPU
        )  # fmt: skip

        def lambda_lr(wrapped: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
            assert schedule is not None
            return torch.optim.lr_scheduler.LambdaLR(wrapped, schedule)

        batch_size, micro_batch_size = sizes or (world, 1)
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=lambda_lr if schedule is not None else None,
            config=deepspeed_config(engine, max_grad_norm, batch_size, micro_batch_size),
        )
        self.device = self.engine.device  # the engine moved the model to its rank's device
        if engine.zero_stage == 3:
            _LIVE_ZERO3.add(self.engine.module)
        elif not engine.overflow_scan:
            check_norm_before_update(self.engine.optimizer)
        if engine.zero_stage == 1 and world == 1:  # an all-reduce over one rank: a pass over
            self.engine.enable_backward_allreduce = False  # every fp32 gradient for nothing

    @property
    def forward_model(self) -> torch.nn.Module:
        return self.engine

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss * self.world)

    def step(self, guard: LossGuard) -> float:
        try:  # ZeRO clips to gradient_clipping; a non-finite norm skips the update
            self.engine.step()
        except NonFiniteNorm as refused:  # engine.overflow_scan false: refused before the update
            guard.check("gradient norm", refused.norm)
            raise
        norm = self.engine.get_global_grad_norm()
        return guard.check("gradient norm", norm) if norm is not None else float("nan")

    def learning_rate(self) -> float:
        if self.scheduler is not None:
            return self.scheduler.get_last_lr()[0]
        return self.engine.optimizer.param_groups[0]["lr"]

    def sampling_model(self) -> torch.nn.Module:
        """The module itself: whole weights under ZeRO-1 and 2, shards under ZeRO-3."""
        return self.engine.module

    def after_update(self) -> None:
        return None

    def frozen_reference(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` (a fresh load of the starting policy) as a frozen DeepSpeed engine: sharded
        like the policy under ZeRO-3, whole and in the policy's precision otherwise. Every rank
        must call it (and, under ZeRO-3, every reference forward) together."""
        import deepspeed

        for p in model.parameters():
            p.requires_grad_(False)
        reference, *_ = deepspeed.initialize(
            model=model, config=reference_config(self.config, self.world)
        )
        reference.eval()
        if self.zero_stage == 3:
            _LIVE_ZERO3.add(reference.module)
        return reference

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The whole model's weights on rank 0 (None elsewhere); every rank must call it."""
        return full_state_dict(self.engine, self.zero_stage)

    def close(self) -> None:
        """Let go of the engine, its optimizer and its model, for a process that goes on after
        it (`close_engine`): their device memory is freed once the caller drops the model too.
        A step that failed inside its backward pass leaves ZeRO's buckets holding gradients;
        such an engine must not train again (ZeRO-3 asserts when the next backward pass hands
        it the same parameters), only close. Safe to call twice."""
        engine, self.engine = self.engine, None
        if engine is not None:
            close_engine(engine)

    # ---- checkpoints: DeepSpeed's own files, committed by a small record written last ---------

    def save(self, ckpt_dir: Path, state: dict[str, Any]) -> None:
        import torch.distributed as dist

        root = ckpt_dir / "deepspeed"
        tag = f"step-{state['step']}"
        self.engine.save_checkpoint(str(root), tag=tag, client_state=state, save_latest=False)
        sync_tree(root / tag)  # each rank: the shards it sees, its own among them
        dist.barrier()  # every rank's shard is on disk before the record names the tag
        if self.engine.global_rank == 0:
            record = root / "committed.json"
            partial = record.with_suffix(".partial")
            partial.write_text(json.dumps({"tag": tag, "fingerprint": state["fingerprint"]}))
            sync_file(partial)
            os.replace(partial, record)
            sync_folder(root)
            for old in root.iterdir():
                if old.is_dir() and old.name != tag:
                    shutil.rmtree(old, ignore_errors=True)
        dist.barrier()

    def load(self, ckpt_dir: Path, fingerprint: str) -> dict[str, Any] | None:
        record = ckpt_dir / "deepspeed" / "committed.json"
        if not record.exists():
            return None
        committed = json.loads(record.read_text())
        if committed["fingerprint"] != fingerprint:
            log.warning("ignoring checkpoint at %s: it belongs to a different run", record.parent)
            return None
        path, state = self.engine.load_checkpoint(str(record.parent), tag=committed["tag"])
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load the committed checkpoint {committed}")
        return dict(state)


def _on_cuda() -> bool:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name() == "cuda"


def close_engine(engine: Any) -> None:
    """A DeepSpeed engine's teardown, the trainer's or a frozen reference's: DeepSpeed's own
    (`destroy()`: ZeRO's gradient hooks, reduce buckets, buffers), the methods and gradient
    views its optimizers leave on every parameter (`_unlink_parameters`), then what DeepSpeed
    0.19 keeps of a ZeRO-3 engine after it, each holding the model or the optimizer alive:
    - the root module its offload appended to `parameter_offload.FWD_MODULE_STACK`, and any
      module of it left there (a forward that raised before its post-forward hook);
    - the partitioned-parameter coordinator's `lru_cache` on `__params_to_release`, keyed by the
      coordinator and its modules;
    - `_z3_optimizer` on every parameter (the ZeRO-3 optimizer, with the fp32 partitions);
    and `torch.nn.functional.linear`, which a ZeRO-3 engine's start replaces for the whole
    process with DeepSpeed's own autograd function (`zero3_linear_wrap`, "until manually
    reset"): every later linear layer, a ZeRO-2 engine's or a sampler's, ran through it. It is
    put back when the last ZeRO-3 engine of the process closes."""
    module = getattr(engine, "module", None)
    engine.destroy()
    if module is not None:
        _unlink_parameters(module)
    if module is None or not any(hasattr(p, "ds_id") for p in module.parameters()):
        return
    _LIVE_ZERO3.discard(module)
    if not _LIVE_ZERO3:
        _restore_linear()
    from deepspeed.runtime.zero import parameter_offload
    from deepspeed.runtime.zero.partitioned_param_coordinator import (
        PartitionedParameterCoordinator,
    )

    mine = {id(m) for m in module.modules()}
    stack = parameter_offload.FWD_MODULE_STACK
    stack[:] = [m for m in stack if id(m) not in mine]
    cached = getattr(
        PartitionedParameterCoordinator, "_PartitionedParameterCoordinator__params_to_release", None
    )
    cached = _lru_cache_inside(cached)
    if cached is not None:
        cached.cache_clear()  # every coordinator's: a live one refills it on its next step
    for param in module.parameters():
        param.__dict__.pop("_z3_optimizer", None)


_LIVE_ZERO3: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # open ZeRO-3 engines' modules


def _unlink_parameters(module: torch.nn.Module) -> None:
    """Drop what DeepSpeed's optimizers hang on each parameter and `destroy()` leaves there:
    methods bound to the parameter itself (`get_full_hp_param`, `load_hp_checkpoint_state`, ...:
    a cycle through a tensor's `__dict__` that the collector does not free, holding the
    parameter for the life of the process) and `_hp_grad`, a view into BF16_Optimizer's whole
    fp32 gradient buffer."""
    for param in module.parameters():
        state = param.__dict__
        for name in [n for n, v in state.items() if getattr(v, "__self__", None) is param]:
            del state[name]
        state.pop("_hp_grad", None)


def _restore_linear() -> None:
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses

    original = getattr(InsertPostInitMethodToModuleSubClasses, "linear_bk", None)
    if original is not None:
        torch.nn.functional.linear = original


def _lru_cache_inside(function: Any) -> Any:
    """The `functools.lru_cache` wrapper inside `function`'s decorators (DeepSpeed's nvtx
    decorator keeps it in its closure), or None."""
    seen = 0
    while function is not None and not hasattr(function, "cache_clear") and seen < 4:
        cells = getattr(function, "__closure__", None) or ()
        inner = [c.cell_contents for c in cells if callable(c.cell_contents)]
        function = getattr(function, "__wrapped__", None) or (inner[0] if inner else None)
        seen += 1
    return function if hasattr(function, "cache_clear") else None


def full_state_dict(engine: Any, zero_stage: int) -> dict[str, torch.Tensor] | None:
    """A DeepSpeed engine's whole model weights on rank 0 (None elsewhere); every rank must call
    it, as ZeRO-3 gathers the shards."""
    if zero_stage == 3:
        return engine._zero3_consolidated_16bit_state_dict()  # fp32 here: the params' dtype
    if engine.global_rank != 0:
        return None
    return {key: value.detach().cpu() for key, value in engine.module.state_dict().items()}
