"""Counter-based random numbers for sampling: each row's draws depend only on its key and step.

A sampler that takes its uniforms from one generator shared by the batch gives a prompt other
samples when the batch around it changes (another batch size, another sort order, or a
data-parallel rank that samples only its share of the prompts). Here a row's key is derived from
(seed, prompt index, sample index), and its uniform at decode step t is a hash of (key, t), so
the same prompt at the same index draws the same tokens wherever it is decoded. This is the
meaning vLLM's per-request seeds have too (sampling/vllm.py `request_seeds`).

The hash is PCG's output permutation (O'Neill 2014, the "pcg_hash" of Jarzynski and Olano 2020)
on 32-bit words, computed in int64 so that no product overflows.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
_TO_UNIT = 1.0 / 2**32


def pcg_hash(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit to 32-bit mixing permutation; `x` is int64 holding values in [0, 2**32)."""
    state = (x * 747796405 + 2891336453) & MASK32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & MASK32
    return (word >> 22) ^ word


def row_keys(seed: int, prompt_indices: torch.Tensor, sample_indices: torch.Tensor) -> torch.Tensor:
    """The key (int64, in [0, 2**32)) of each row: sample `sample_indices[i]` of prompt
    `prompt_indices[i]` under `seed`."""
    base = pcg_hash(torch.tensor(seed & MASK32, dtype=torch.int64))
    keyed = pcg_hash((base + prompt_indices.to(torch.int64)) & MASK32)
    return pcg_hash((keyed + pcg_hash(sample_indices.to(torch.int64))) & MASK32)


def uniforms(keys: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """One uniform in [0, 1) per key (A,) at decode step `step`, as float64 (A, 1). `step` may
    be a one-element int64 tensor on the keys' device (a CUDA graph's input)."""
    if not isinstance(step, torch.Tensor):
        step = torch.tensor(step, dtype=torch.int64)
    salt = pcg_hash(step & MASK32)
    return (pcg_hash(keys ^ salt).to(torch.float64) * _TO_UNIT)[:, None]
