"""What vLLM mixes into its GPU workers so that a weight sync can reach the model they hold.

`LLM(worker_extension_cls="sampling.vllm_worker.WeightLoadExtension")` makes vLLM add this
class to its worker's bases (vLLM's RLHF examples use the same mechanism), and
`llm.collective_rpc("load_trainer_weights", args=(weights,))` then runs the method on every
worker: in this process for a single-GPU engine, in each tensor-parallel worker process
otherwise, where the model's own `load_weights` keeps the rows of each tensor that belong to
that worker's shard.

It lives in a module of its own, importing nothing from vLLM or torch at import time, because
vLLM imports it by name inside its worker processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

LOAD_METHOD = "load_trainer_weights"
EXTENSION = f"{__name__}.WeightLoadExtension"


class WeightLoadExtension:
    """Mixed into vLLM's Worker: `self.model_runner` is the worker's GPU model runner."""

    model_runner: Any

    def load_trainer_weights(self, weights: Sequence[tuple[str, Any]]) -> int:
        """Copy (checkpoint name, tensor) pairs into the worker's model; returns how many.

        The model's `load_weights` maps checkpoint names onto its own layout (q/k/v into one
        fused projection, this worker's tensor-parallel rows, the engine's dtype) and copies in
        place, so captured CUDA graphs keep pointing at the right memory.
        """
        runner = self.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        model.load_weights(weights=list(weights))
        return len(weights)
