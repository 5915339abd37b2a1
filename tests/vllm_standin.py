"""A stand-in for vLLM's offline engine, for tests on machines where vLLM cannot run.

vLLM has no CPU wheel, so these objects take the place of `vllm.LLM` and `vllm.SamplingParams`
behind VLLMSampler (sampling/vllm.py). They are not vLLM and say nothing about vLLM itself;
they implement the part of its interface the sampler calls, with the behaviour the sampler
relies on, around a real transformers model loaded from the engine's model folder:
- `get_tokenizer()`, and `generate(requests, params, use_tqdm)` over `{"prompt_token_ids"}`
  requests, decoding with our own loop and answering with RequestOutput-shaped objects;
- `collective_rpc(method, args=...)` calling the method on one worker object that has our
  WeightLoadExtension mixed in, as vLLM does with `worker_extension_cls`; the worker's model
  `load_weights` reads checkpoint names and skips `lm_head.*` when the embeddings are tied,
  as vLLM's Qwen2 and Llama models do;
- `reset_prefix_cache()`, counted.
Calls can be made to sleep (a hang) or raise, to test the time limits.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from models.loading import load_model, load_tokenizer
from sampling.decode import decode
from sampling.streams import row_keys
from sampling.vllm import VLLMApi
from sampling.vllm_worker import WeightLoadExtension


class Abandoned(Exception):
    """Ends a hung call once its test is done."""


@dataclass
class Behaviour:
    """What the stand-in does besides its work: seconds to hang in a call, errors to raise."""

    hang: dict[str, float] = field(default_factory=dict)  # "start" | "generate" | "rpc" -> s
    errors: dict[str, BaseException] = field(default_factory=dict)
    release: threading.Event = field(default_factory=threading.Event)  # ends every hang early
    ended: list[str] = field(default_factory=list)  # the calls whose hang ran its whole time

    def act(self, call: str) -> None:
        if call in self.hang:
            if self.release.wait(self.hang[call]):
                raise Abandoned(call)  # the test is over: end here, touching nothing more
            self.ended.append(call)
        if call in self.errors:
            raise self.errors[call]


class EngineModel:
    """The worker's model: vLLM's `load_weights(weights)` contract over a transformers model."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.loaded: list[tuple[str, tuple[int, ...]]] = []  # (name, shape) per tensor, in order
        self.calls: list[int] = []  # tensors per load_weights call

    def load_weights(self, weights: Sequence[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.model.named_parameters())
        tied = self.model.config.tie_word_embeddings
        done = set()
        for name, tensor in weights:
            self.loaded.append((name, tuple(tensor.shape)))
            if tied and name.startswith("lm_head."):
                continue
            with torch.no_grad():
                params[name].copy_(tensor)  # a name the model lacks is a KeyError, as in vLLM
            done.add(name)
        self.calls.append(len(weights))
        return done


class StandInWorker(WeightLoadExtension):
    def __init__(self, model: torch.nn.Module):
        self.model_runner = SimpleNamespace(model=EngineModel(model))


class StandInLLM:
    """`vllm.LLM(**kwargs)`; the model folder is `kwargs["model"]`."""

    instances: list[StandInLLM] = []
    behaviour = Behaviour()

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        self.behaviour.act("start")
        self.tokenizer = load_tokenizer(kwargs["model"])
        self.model = load_model(kwargs["model"]).eval()
        self.worker = StandInWorker(self.model)
        self.prefix_resets = 0
        self.requests: list[tuple[list[int], dict]] = []
        self.trainer_model: torch.nn.Module | None = None  # set by a test, to compare weights
        self.staleness: list[float] = []  # max |engine - trainer| weight at each generate
        StandInLLM.instances.append(self)

    @property
    def engine_model(self) -> EngineModel:
        return self.worker.model_runner.model

    def get_tokenizer(self):
        return self.tokenizer

    def generate(self, requests: list[dict], params: list[dict], use_tqdm: bool = True):
        self.behaviour.act("generate")
        if self.trainer_model is not None:
            self.staleness.append(max_difference(self.model, self.trainer_model))
        return [
            self._request(r["prompt_token_ids"], p) for r, p in zip(requests, params, strict=True)
        ]

    def _request(self, ids: list[int], p: dict) -> SimpleNamespace:
        self.requests.append((list(ids), p))
        n = p["n"]
        keys = row_keys(p["seed"], torch.zeros(n, dtype=torch.long), torch.arange(n))
        done = decode(
            self.model,
            [ids],
            [0] * n,
            temperature=p["temperature"],
            top_p=p["top_p"],
            max_new_tokens=p["max_tokens"],
            stop_ids=p["stop_token_ids"],
            pad_id=self.tokenizer.pad_token_id,
            keys=keys,
        )
        outputs = []
        for j, d in enumerate(done):
            text_ids = d.token_ids[:-1] if d.finish_reason == "stop" else d.token_ids
            logprobs = [
                {t: SimpleNamespace(logprob=lp)}
                for t, lp in zip(d.token_ids, d.logprobs, strict=True)
            ]
            text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
            outputs.append(
                SimpleNamespace(
                    index=j,
                    text=text,
                    token_ids=d.token_ids,
                    logprobs=logprobs,
                    finish_reason=d.finish_reason,
                )
            )
        return SimpleNamespace(outputs=list(reversed(outputs)))  # any order: mapped by index

    def collective_rpc(self, method: str, timeout: float | None = None, args=(), kwargs=None):
        self.behaviour.act("rpc")
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def reset_prefix_cache(self) -> bool:
        self.prefix_resets += 1
        return True


def sampling_params(**kwargs: Any) -> dict:
    """`vllm.SamplingParams(**kwargs)`: kept as the dict of what was asked."""
    return dict(kwargs)


def standin_api() -> VLLMApi:
    return VLLMApi(StandInLLM, sampling_params)


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """Largest absolute difference between two models' weights of the same names."""
    theirs = dict(b.named_parameters())
    return max(float((p - theirs[n]).detach().abs().max()) for n, p in a.named_parameters())
