"""One process's mixed-precision engine: bf16 weights for the passes, fp32 master weights for AdamW.

What DeepSpeed's bf16 ZeRO-2 engine does on one GPU, without its machinery for many (buckets
and collectives on a world of one, an overflow scan of every gradient that reads back to the
host, a norm per parameter): the model's weights are bf16 for the forward and backward passes;
each backward pass's bf16 gradients are added into fp32 buffers (micro-batches accumulate in
fp32); one step takes the global norm of those buffers (one read back to the host), refuses a
non-finite one before anything is applied, clips, runs AdamW (fused on a GPU) on fp32 master
weights and copies them back into the bf16 weights. An update far below bf16's resolution (a
learning rate of 1e-6 on a weight of 0.02 moves it by a thirtieth of half a bf16 step) still
moves the master weight, which the bf16 weight follows once the moves add up; a bf16 optimizer
without master weights would round every one of them away.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from training.checkpoints import load_checkpoint, save_checkpoint
from training.engines import LocalEngine, Schedule
from training.finite import LossGuard


class MixedPrecisionEngine(LocalEngine):
    """AdamW on fp32 master weights of a model that runs in `dtype` (bf16)."""

    def __init__(
        self,
        model: torch.nn.Module,
        learning_rate: float,
        max_grad_norm: float,
        weight_decay: float = 0.0,
        schedule: Schedule | None = None,
        dtype: torch.dtype = torch.bfloat16,
        gradient_checkpointing: bool = False,
    ):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.masters = [torch.nn.Parameter(p.detach().float().clone()) for p in self.params]
        model.to(dtype)
        super().__init__(
            model, learning_rate, max_grad_norm, weight_decay, schedule, gradient_checkpointing
        )

    def _optimized(self) -> list[torch.nn.Parameter]:
        return self.masters

    def backward(self, loss: torch.Tensor) -> None:
        """The pass's bf16 gradients added into the masters' fp32 gradients, then dropped."""
        loss.backward()
        for master, param in zip(self.masters, self.params, strict=True):
            if param.grad is None:
                continue
            if master.grad is None:
                master.grad = param.grad.float()
            else:
                master.grad.add_(param.grad)
            param.grad = None

    def step(self, guard: LossGuard) -> float:
        """Clip to `max_grad_norm` and update, unless the gradients' norm is not finite: then
        nothing is applied and `guard` raises (the stage stops as for a non-finite loss)."""
        grads = [m.grad for m in self.masters if m.grad is not None]
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) if grads else 0
        try:
            norm = guard.check("gradient norm", total)
        except Exception:
            self.optimizer.zero_grad(set_to_none=True)
            raise
        if grads and norm > self.max_grad_norm:
            torch._foreach_mul_(grads, self.max_grad_norm / (norm + 1e-6))
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            torch._foreach_copy_([p.data for p in self.params], [m.data for m in self.masters])
        return norm

    def full_precision(self) -> torch.nn.Module:
        """The model in fp32 with the master weights (what a stage saves), after training."""
        self._model.float()
        with torch.no_grad():
            for param, master in zip(self.params, self.masters, strict=True):
                param.copy_(master)
        return self._model

    def save(self, ckpt_dir: Path, state: dict[str, Any]) -> None:
        payload = {
            "masters": [m.detach() for m in self.masters],
            "optimizer": self.optimizer.state_dict(),
        }
        if self.scheduler is not None:
            payload["scheduler"] = self.scheduler.state_dict()
        save_checkpoint(ckpt_dir, payload | state)

    def load(self, ckpt_dir: Path, fingerprint: str) -> dict[str, Any] | None:
        state = load_checkpoint(ckpt_dir, fingerprint)
        if state is None:
            return None
        with torch.no_grad():
            for master, saved in zip(self.masters, state.pop("masters"), strict=True):
                master.copy_(saved)
            torch._foreach_copy_([p.data for p in self.params], [m.data for m in self.masters])
        self.optimizer.load_state_dict(state.pop("optimizer"))
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state.pop("scheduler"))
        return state
