"""Choosing a sampler backend by name, as the config names it."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from configs.reinforcement import SamplerConfig
from sampling.decode import LockStep
from sampling.interface import Completion, SamplingParams

log = logging.getLogger(__name__)

Backend = Literal["hf", "vllm"]


class Sampler(Protocol):
    """What generates completions. Whoever opens a sampler closes it when done (`close()`):
    a vLLM engine holds device memory until then, and the next engine cannot start beside it."""

    def generate(
        self, prompts: Sequence[str], n: int, params: SamplingParams
    ) -> list[list[Completion]]: ...

    def close(self) -> None: ...


def make_sampler(
    backend: Backend,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    model_path: str | Path | None = None,
    batch_size: int = 64,
    **kwargs: Any,
) -> Sampler:
    """`hf` samples with the in-process `model` and `tokenizer`; `vllm` loads `model_path` into
    its own engine (kwargs go to `VLLMSampler`: config, seed, weight_sync)."""
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


def context_length(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], max_new_tokens: int
) -> int:
    """The longest of `prompts` in tokens (as the samplers tokenize them) + `max_new_tokens`: the
    context a vLLM engine must hold for them, instead of the model's whole context."""
    if not prompts:
        return max_new_tokens
    ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    return max(len(x) for x in ids) + max_new_tokens


def sized(
    config: SamplerConfig,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    max_new_tokens: int,
) -> SamplerConfig:
    """`config` with a vLLM engine's `max_model_len` set to the longest of `prompts` +
    `max_new_tokens` (the context the stage needs, not the model's whole context), unless the
    config sets one; other backends unchanged."""
    if config.backend != "vllm" or config.max_model_len is not None or not prompts:
        return config
    return config.model_copy(
        update={"max_model_len": context_length(tokenizer, prompts, max_new_tokens)}
    )


def open_sampler(
    config: SamplerConfig,
    model_path: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
) -> Sampler:
    """The configured sampler for a saved model; the hf model is loaded only when it is used.
    vllm gets the whole config: tensor parallel size, memory share, lengths (`sized`), time
    limits. The caller closes it."""
    if config.backend == "vllm":
        return make_sampler("vllm", model_path=model_path, config=config)
    from models.loading import load_model, model_device

    model = load_model(model_path).to(model_device())
    return make_sampler("hf", model, tokenizer, batch_size=batch_size)


def policy_sampler(
    config: SamplerConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    policy_path: str | Path | None = None,
    max_model_len: int | None = None,
    lockstep: LockStep | None = None,
    materialize: Any = None,
) -> Sampler:
    """The sampler a trainer draws its rollouts from.

    hf samples from `model` itself, so it sees every update as it happens. vllm starts an
    engine in this process from `policy_path` (the folder the policy was loaded from; without
    one, `model` is saved to a temporary folder first) and holds its own copy of the weights,
    which the trainer brings up to date with `sync_weights(model)` after each update. A
    temporary folder is the sampler's to remove when it closes. `lockstep` and `materialize`
    are the hf sampler's ways of sampling a ZeRO-3 model (sampling/hf.py).
    """
    if config.backend == "hf":
        return make_sampler(
            "hf", model, tokenizer, batch_size=batch_size, show_progress=False, lockstep=lockstep,
            materialize=materialize,
        )  # fmt: skip
    owned = None
    if policy_path is None:
        policy_path = owned = tempfile.mkdtemp(prefix="r1-policy-")
        model.save_pretrained(policy_path)
        tokenizer.save_pretrained(policy_path)
        log.info("policy saved to %s for the vLLM engine to start from", policy_path)
    return make_sampler(
        "vllm",
        model_path=policy_path,
        config=config,
        weight_sync=True,
        max_model_len=max_model_len,
        owned_dir=owned,
    )
