"""Choosing a sampler backend by name, as the config names it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from configs.schema import SamplerConfig
from sampling.types import Completion, SamplingParams

Backend = Literal["hf", "vllm"]


class Sampler(Protocol):
    def generate(
        self, prompts: Sequence[str], n: int, params: SamplingParams
    ) -> list[list[Completion]]: ...


def make_sampler(
    backend: Backend,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    model_path: str | Path | None = None,
    batch_size: int = 64,
    **kwargs: Any,
) -> Sampler:
    """`hf` samples with the in-process `model` and `tokenizer`; `vllm` loads `model_path` into
    its own engine (kwargs go to `VLLMSampler`: tensor_parallel_size, gpu_memory_utilization, ...).
    """
    if backend == "hf":
        if model is None or tokenizer is None:
            raise ValueError("the hf sampler needs a model and a tokenizer")
        from sampling.hf import HFSampler

        return HFSampler(model, tokenizer, batch_size=batch_size, **kwargs)
    if backend == "vllm":
        if model_path is None:
            raise ValueError(
                "the vllm sampler needs model_path: a folder saved with save_pretrained"
            )
        from sampling.vllm import VLLMSampler

        return VLLMSampler(str(model_path), **kwargs)
    raise ValueError(f"unknown sampler backend {backend!r}; expected 'hf' or 'vllm'")


def open_sampler(
    config: SamplerConfig,
    model_path: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
) -> Sampler:
    """The configured sampler for a saved model; the hf model is loaded only when it is used."""
    if config.backend == "vllm":
        return make_sampler(
            "vllm",
            model_path=model_path,
            tensor_parallel_size=config.tensor_parallel_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
        )
    from models.loading import load_model

    return make_sampler("hf", load_model(model_path), tokenizer, batch_size=batch_size)
