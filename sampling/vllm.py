"""The GPU backend: vLLM's offline `LLM` engine behind the same `generate` as the CPU sampler.

vllm is imported only when an engine starts, so this module imports (and its mapping, engine
arguments and weight sync are testable) on machines without it; it comes with the `gpu` extra
(`pip install -e .[gpu]`) and has no CPU wheel. Tests hand the sampler stand-ins for `LLM` and
`SamplingParams` (VLLMApi). Every engine call runs under a time limit from the config
(sampling/watchdog.py): start, each generate, each weight sync. The engine is built on the
watchdog's thread, which needs vLLM 0.10.2 or newer (earlier versions refused to start an
engine outside the main thread).

Prompts are sent as token ids, tokenized as the CPU sampler tokenizes them (no special tokens
added: the chat template already wrote them), so both backends continue the same tokens.

A colocated engine for a trainer (`weight_sync=True`) runs in this process, as TRL's colocate
mode does: `distributed_executor_backend="external_launcher"`, which keeps vLLM's engine core
and its one worker in this process (a lone process poses as rank 0 of 1), so the trainer's
tensors reach the worker by reference. With tensor_parallel_size > 1 the workers are other
processes and each chunk goes to them through host memory. Weights arrive through
`LLM.collective_rpc` and our worker extension (sampling/vllm_worker.py).

Logprobs keep the meaning the CPU sampler gives them: the engine runs with
`logprobs_mode="processed_logprobs"`, so each is the sampled token's log-probability under the
distribution it was drawn from (after temperature and top-p), not the raw model distribution
that vLLM reports by default. Each request asks for `logprobs=0`: only the sampled token's.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from configs.reinforcement import SamplerConfig
from models.chat import stop_token_ids
from sampling.interface import Completion, SamplingParams
from sampling.vllm_worker import EXTENSION, LOAD_METHOD
from sampling.watchdog import Deadline, EngineThread
from sampling.weight_sync import Gather, SyncReport, WeightSync

FINISH_REASONS = {"stop": "stop", "length": "length"}

# Seeds of successive prompts in one call: far apart so no two prompts share a random stream.
SEED_STRIDE = 1_000_003


class VLLMOutput(Protocol):
    """The part of vLLM's `CompletionOutput` that the mapping reads."""

    text: str
    token_ids: Sequence[int]
    logprobs: Sequence[Mapping[int, Any]] | None  # per position: token id -> Logprob
    finish_reason: str | None


def sampled_logprob(entry: Any) -> float:
    """A `Logprob` object's value (plain floats are accepted too)."""
    return float(getattr(entry, "logprob", entry))


def completion_from_vllm(output: VLLMOutput) -> Completion:
    """One vLLM completion as ours: stripped text, token ids, sampled tokens' logprobs, finish."""
    reason = FINISH_REASONS.get(output.finish_reason or "")
    if reason is None:
        raise ValueError(f"vLLM finished a sequence with {output.finish_reason!r}")
    ids = list(output.token_ids)
    if output.logprobs is None:
        raise ValueError("vLLM returned no logprobs: the request must set logprobs=0")
    logprobs = [sampled_logprob(output.logprobs[i][t]) for i, t in enumerate(ids)]
    return Completion(output.text.strip(), ids, logprobs, reason)  # type: ignore[arg-type]


def completions_from_request(request_output: Any) -> list[Completion]:
    """The n completions of one `RequestOutput`, in sample-index order."""
    outputs = sorted(request_output.outputs, key=lambda o: getattr(o, "index", 0))
    return [completion_from_vllm(o) for o in outputs]


def request_seeds(seed: int, n_prompts: int, prompt_offset: int = 0) -> list[int]:
    """One seed per prompt: vLLM seeds each request's generator with its own `seed`, so prompts
    sharing one would share their random draws. Prompt i's seed depends on `prompt_offset + i`
    only (SamplingParams). Kept within a signed 64-bit integer."""
    return [(seed * SEED_STRIDE + prompt_offset + i) % 2**63 for i in range(n_prompts)]


GPU_EXTRA = (
    "the vllm sampler needs vLLM, which is not installed: install the `gpu` extra "
    "(pip install -e '.[gpu]') on a machine with a CUDA GPU, or use the hf backend"
)


@dataclass(frozen=True)
class VLLMApi:
    """The vLLM entry points the sampler uses (tests pass stand-ins)."""

    llm: Callable[..., Any]  # vllm.LLM
    sampling_params: Callable[..., Any]  # vllm.SamplingParams


def import_vllm() -> VLLMApi:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(GPU_EXTRA) from err
    return VLLMApi(vllm.LLM, vllm.SamplingParams)


def engine_args(
    model_path: str, config: SamplerConfig, seed: int, weight_sync: bool, distributed: bool
) -> dict[str, Any]:
    """`LLM(**engine_args(...))`: the config's engine settings, and for a trainer's engine the
    worker extension and the in-process executor. Under data-parallel ranks (`distributed`)
    each rank runs its own engine over its share of the prompts, so it cannot be sharded."""
    args: dict[str, Any] = {
        "model": str(model_path),
        "tensor_parallel_size": config.tensor_parallel_size,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "max_model_len": config.max_model_len,
        "dtype": config.dtype,
        "seed": seed,
        "logprobs_mode": "processed_logprobs",
    }
    if weight_sync:
        args["worker_extension_cls"] = EXTENSION
        if config.tensor_parallel_size == 1:
            args["distributed_executor_backend"] = "external_launcher"
        elif distributed:
            raise ValueError(
                "a trainer's vLLM engine under data-parallel ranks is one engine per rank: "
                f"set sampler.tensor_parallel_size to 1 (it is {config.tensor_parallel_size})"
            )
    return args


def launcher_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What vLLM's external launcher reads from torch.distributed's variables, for a process
    that is no rank of a launched group: rank 0 of 1 on a free local port. Variables already
    set (a torchrun launch) are kept."""
    wanted = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    missing = {key: value for key, value in wanted.items() if key not in environ}
    if "MASTER_PORT" not in environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            missing["MASTER_PORT"] = str(s.getsockname()[1])
    return missing


def request_params(params: SamplingParams, n: int, seed: int, stop_ids: Sequence[int]) -> dict:
    """One request's vLLM SamplingParams: `logprobs=0` asks for the sampled token's only; it
    stops on the end-of-turn and EOS ids (models.chat.stop_token_ids)."""
    return {
        "n": n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_new_tokens,
        "seed": seed,
        "logprobs": 0,
        "stop_token_ids": list(stop_ids),
    }


def torch_distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


class VLLMSampler:
    """`generate(prompts, n, params)` on vLLM; with `weight_sync`, also `sync_weights(model)`."""

    def __init__(
        self,
        model_path: str,
        config: SamplerConfig | None = None,
        seed: int = 0,
        weight_sync: bool = False,
        api: VLLMApi | None = None,
    ):
        self.config = config or SamplerConfig(backend="vllm")
        api = api or import_vllm()
        self._params = api.sampling_params
        distributed = torch_distributed()
        kwargs = engine_args(model_path, self.config, seed, weight_sync, distributed)
        if kwargs.get("distributed_executor_backend") == "external_launcher" and not distributed:
            os.environ.update(launcher_env(os.environ))
        self._thread = EngineThread("vllm-engine")
        self.llm = self._thread.call(
            lambda: api.llm(**kwargs),
            self.config.start_timeout_s,
            "engine start",
            "start_timeout_s",
        )
        self.tokenizer = self.llm.get_tokenizer()
        # the chat template's end-of-turn as well as EOS (models.chat.stop_token_ids)
        self.stop_ids = stop_token_ids(self.tokenizer)
        self._sync: WeightSync | None = None
        if weight_sync:
            budget = self.config.sync_chunk_mb * 2**20
            self._sync = WeightSync(self._load, budget, after_sync=self._reset_prefix_cache)
        self._deadline: Deadline | None = None

    def generate(
        self, prompts: Sequence[str], n: int, params: SamplingParams
    ) -> list[list[Completion]]:
        """n completions for each prompt, in prompt order."""
        if not prompts:
            return []
        ids = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        requests = [{"prompt_token_ids": list(x)} for x in ids]
        per_prompt = [
            self._params(**request_params(params, n, seed, self.stop_ids))
            for seed in request_seeds(params.seed, len(prompts), params.prompt_offset)
        ]
        outputs = self._thread.call(
            lambda: self.llm.generate(requests, per_prompt, use_tqdm=False),
            self.config.generate_timeout_s,
            "generate",
            "generate_timeout_s",
        )
        return [completions_from_request(o) for o in outputs]

    def sync_weights(self, model: torch.nn.Module, gather: Gather | None = None) -> SyncReport:
        """Load `model`'s current weights into the engine and reset its prefix cache, all within
        `sync_timeout_s`; `gather` makes partitioned parameters whole (default: by their kind)."""
        if self._sync is None:
            raise RuntimeError("this vLLM engine was started without weight_sync=True")
        self._deadline = Deadline(self.config.sync_timeout_s, "weight sync", "sync_timeout_s")
        return self._sync.sync(model, gather)

    def _load(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """One chunk to every worker. Workers in other processes (tensor parallel) get it
        through host memory; the in-process worker takes the tensors as they are."""
        assert self._deadline is not None
        if self.config.tensor_parallel_size > 1:
            weights = [(name, tensor.to("cpu")) for name, tensor in weights]
        self._deadline.call(
            self._thread, lambda: self.llm.collective_rpc(LOAD_METHOD, args=(weights,))
        )

    def _reset_prefix_cache(self) -> None:
        """KV blocks cached for earlier prompts were computed with the old weights."""
        assert self._deadline is not None
        self._deadline.call(self._thread, self.llm.reset_prefix_cache)
