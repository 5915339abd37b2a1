"""Process-wide state that an in-process engine changes, kept and put back around its start.

A vLLM engine that runs in the calling process (the colocated engine of a trainer, vLLM's
`external_launcher` executor) changes the whole process as it starts, read in vLLM 0.33.0's
source (0.10.2 does the same):
- `set_random_seed(seed)` reseeds Python's `random`, NumPy's and torch's global generators
  (`v1/worker/gpu_worker.py`, `utils/torch_utils.py`);
- `torch.set_float32_matmul_precision(VLLM_FLOAT32_MATMUL_PRECISION)` (`gpu_worker.py`);
- `gc.freeze()` after start-up (`v1/engine/core.py` `freeze_gc_heap`);
- `os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"` (`config/parallel.py`), besides the
  `RANK`, `WORLD_SIZE`, `MASTER_*` variables the sampler itself sets for a lone process.

Left in place, they outlive the engine: a later DeepSpeed launch copies the variables into its
workers' environment, a later engine reads the multiprocessing switch and runs in-process too,
and every later draw from the global generators repeats the engine's seed. `preserved()` takes
a snapshot before the start and restores it after, so the process leaves the start as it went
in. The engine keeps what it needs: it reads these variables while starting, and samples from
per-request generators.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessState:
    environ: dict[str, str]
    python_random: Any
    numpy_random: Any | None
    torch_cpu: torch.Tensor
    torch_cuda: list[torch.Tensor] | None
    matmul_precision: str
    gc_frozen: int


def snapshot() -> ProcessState:
    """The process-wide state an engine start may change."""
    try:
        import numpy

        numpy_state = numpy.random.get_state()
    except ImportError:
        numpy_state = None
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return ProcessState(
        environ=dict(os.environ),
        python_random=random.getstate(),
        numpy_random=numpy_state,
        torch_cpu=torch.get_rng_state(),
        torch_cuda=cuda,
        matmul_precision=torch.get_float32_matmul_precision(),
        gc_frozen=gc.get_freeze_count(),
    )


def restore(state: ProcessState) -> list[str]:
    """Put `state` back; returns what had changed (for the log)."""
    changed = _restore_environ(state.environ)
    random.setstate(state.python_random)
    if state.numpy_random is not None:
        import numpy

        numpy.random.set_state(state.numpy_random)
    torch.set_rng_state(state.torch_cpu)
    if state.torch_cuda is not None:
        torch.cuda.set_rng_state_all(state.torch_cuda)
    if torch.get_float32_matmul_precision() != state.matmul_precision:
        changed.append(f"float32 matmul precision {torch.get_float32_matmul_precision()}")
        torch.set_float32_matmul_precision(state.matmul_precision)
    if gc.get_freeze_count() > state.gc_frozen and state.gc_frozen == 0:
        changed.append("gc.freeze()")
        gc.unfreeze()
    return changed


def _restore_environ(before: dict[str, str]) -> list[str]:
    """os.environ as it was: added variables removed, changed ones reset; their names."""
    changed = []
    for key in [k for k in os.environ if k not in before]:
        changed.append(key)
        del os.environ[key]
    for key, value in before.items():
        if os.environ.get(key) != value:
            changed.append(key)
            os.environ[key] = value
    return changed


@contextlib.contextmanager
def preserved(what: str) -> Iterator[None]:
    """Run the block, then restore the process-wide state it found (also when it raises)."""
    state = snapshot()
    try:
        yield
    finally:
        changed = restore(state)
        if changed:
            log.info("%s changed process state; restored: %s", what, ", ".join(sorted(changed)))
