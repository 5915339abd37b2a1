"""The GPU backend: vLLM's offline `LLM` engine behind the same `generate` as the CPU sampler.

Read against vLLM 0.33.0's source (and 0.10.2's, the oldest the `gpu` extra admits). vllm is
imported only when an engine starts, so this module imports (and its mapping, engine arguments
and weight sync are testable) on machines without it. Tests hand the sampler stand-ins for `LLM`
and `SamplingParams` (VLLMApi, tests/vllm_standin.py, written from that source). Every engine
call runs under a time limit from the config (sampling/watchdog.py).

Prompts are sent as token ids, tokenized as the CPU sampler tokenizes them (no special tokens
added: the chat template already wrote them), so both backends continue the same tokens.

Who frees the engine: the sampler's owner, with `close()` (or `with`), when its stage ends,
failure included. `close()` shuts the engine core down (its worker, KV cache and weights; the
engine process when it has one), drops every reference to the `LLM`, empties the device cache
and removes a policy folder the sampler was given to own. vLLM refuses to start an engine while
free device memory is below `gpu_memory_utilization` x total (`v1/worker/utils.py`
`request_memory`), so an engine left open makes the next one fail.

A colocated engine for a trainer (`weight_sync=True`) runs in this process, as TRL's colocate
mode does: `distributed_executor_backend="external_launcher"`, which keeps vLLM's engine core
and its one worker in this process (a lone process poses as rank 0 of 1), so the trainer's
tensors reach the worker by reference. Such a start changes process-wide state (global RNGs,
matmul precision, gc.freeze, environment variables); it is restored once the engine is up
(sampling/process_state.py). With `sleep_mode`, the engine gives its memory back during the
trainer's update: `sleep()` (level 2: weights and KV cache discarded), then the next weight sync
wakes the weights and loads them all, and the next generate wakes the KV cache, the order TRL's
colocate mode uses. Weights arrive through `LLM.collective_rpc` and our worker extension
(sampling/vllm_worker.py).

Logprobs keep the meaning the CPU sampler gives them: the engine runs with
`logprobs_mode="processed_logprobs"`, so each is the sampled token's log-probability under the
distribution it was drawn from (after temperature and top-p). Each request asks for
`logprobs=0`: only the sampled token's.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from configs.reinforcement import SamplerConfig
from models.chat import stop_token_ids
from sampling.interface import Completion, SamplingParams
from sampling.process_state import preserved
from sampling.vllm_worker import EXTENSION, LOAD_METHOD
from sampling.watchdog import Deadline, EngineThread
from sampling.weight_sync import Gather, SyncReport, WeightSync

log = logging.getLogger(__name__)

FINISH_REASONS = {"stop": "stop", "length": "length"}

# vLLM seeds sample j of a request with seed s from s + j (v1/engine/parallel_sampling.py), so
# successive prompts' seeds are this far apart: up to this many samples per prompt never share
# a seed with another prompt's.
SEED_SPACING = 2**20
SEED_MODULUS = 2**63 - SEED_SPACING  # every s + j stays a signed 64-bit integer
SLEEP_LEVEL = 2  # weights and KV cache discarded: every weight is loaded again by the next sync


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


def mix64(value: int) -> int:
    """SplitMix64's finaliser: a seed spread over 64 bits, so nearby seeds land far apart."""
    z = (value + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def request_seeds(seed: int, n_prompts: int, n: int, prompt_offset: int = 0) -> list[int]:
    """One seed per prompt, for requests of `n` samples each.

    vLLM draws sample j of a request seeded s from its own generator seeded s + j, so prompt
    i's samples use the seeds [s_i, s_i + n). Prompt i's seed is base + (prompt_offset + i) x
    SEED_SPACING: within a call (and across the ranks that share a step) no two samples share a
    seed, whatever n up to SEED_SPACING, and prompt i's seeds depend on its index alone
    (SamplingParams). The base is `seed` mixed over 64 bits, so calls with other seeds (another
    step, another chunk) take ranges far from these.
    """
    if n > SEED_SPACING:
        raise ValueError(f"at most {SEED_SPACING} samples per prompt (asked {n})")
    base = mix64(seed)
    return [(base + (prompt_offset + i) * SEED_SPACING) % SEED_MODULUS for i in range(n_prompts)]


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
    model_path: str,
    config: SamplerConfig,
    seed: int,
    weight_sync: bool,
    distributed: bool,
    max_model_len: int | None = None,
) -> dict[str, Any]:
    """`LLM(**engine_args(...))`: the config's engine settings, and for a trainer's engine the
    worker extension, the in-process executor and sleep mode. `max_model_len` (the stage's
    longest prompt + completion) applies when the config sets none; without either the engine
    takes the model's whole context. Under data-parallel ranks (`distributed`) each rank runs
    its own engine over its share of the prompts, so it cannot be sharded."""
    args: dict[str, Any] = {
        "model": str(model_path),
        "tensor_parallel_size": config.tensor_parallel_size,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "max_model_len": config.max_model_len or max_model_len,
        "dtype": config.dtype,
        "seed": seed,
        "logprobs_mode": "processed_logprobs",
    }
    if weight_sync:
        args["worker_extension_cls"] = EXTENSION
        args["enable_sleep_mode"] = config.sleep_mode
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


def release_cached_memory() -> None:
    """Give torch's cached, unused device blocks back to the device."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def torch_distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


class VLLMSampler:
    """`generate(prompts, n, params)` on vLLM; with `weight_sync`, also `sync_weights(model)`
    and `sleep()`. Close it when done (`close()` or `with`)."""

    def __init__(
        self,
        model_path: str,
        config: SamplerConfig | None = None,
        seed: int = 0,
        weight_sync: bool = False,
        api: VLLMApi | None = None,
        max_model_len: int | None = None,
        owned_dir: str | Path | None = None,
    ):
        """`max_model_len`: the longest prompt + completion the caller will ask for (used when
        the config sets none); `owned_dir`: a folder (the policy saved for the engine) that
        `close()` removes."""
        self.config = config or SamplerConfig(backend="vllm")
        self._owned_dir = Path(owned_dir) if owned_dir is not None else None
        distributed = torch_distributed()
        kwargs = engine_args(model_path, self.config, seed, weight_sync, distributed, max_model_len)
        self.max_model_len: int | None = kwargs["max_model_len"]
        self._sleeping = False  # weights and KV cache discarded (SLEEP_LEVEL)
        self._weights_stale = False  # woken weights not yet loaded by a sync
        self._thread = EngineThread("vllm-engine")
        with preserved("the vLLM engine's start"):
            api = api or import_vllm()  # `import vllm` sets variables of its own
            self._params = api.sampling_params
            in_process = kwargs.get("distributed_executor_backend") == "external_launcher"
            if in_process and not distributed:
                os.environ.update(launcher_env(os.environ))
            self.llm: Any = self._thread.call(
                lambda: api.llm(**kwargs),
                self.config.start_timeout_s,
                "engine start",
                "start_timeout_s",
            )
        self.tokenizer = self.llm.get_tokenizer()
        # the chat template's end-of-turn as well as EOS (models.chat.stop_token_ids); vLLM adds
        # the folder's generation_config.json eos ids to each request itself
        self.stop_ids = stop_token_ids(self.tokenizer)
        self._sync: WeightSync | None = None
        if weight_sync:
            budget = self.config.sync_chunk_mb * 2**20
            self._sync = WeightSync(self._load, budget, after_sync=self._reset_prefix_cache)
        self._deadline: Deadline | None = None

    # ---- sampling ------------------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[str], n: int, params: SamplingParams
    ) -> list[list[Completion]]:
        """n completions for each prompt, in prompt order."""
        if not prompts:
            return []
        llm = self._open()
        if self._weights_stale:
            raise RuntimeError(
                "the engine's weights were discarded by sleep() and not loaded again: call "
                "sync_weights(model) before generating"
            )
        ids = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        self._check_lengths(ids, params.max_new_tokens)
        if self._sleeping:
            self._wake(["kv_cache"])
        requests = [{"prompt_token_ids": list(x)} for x in ids]
        per_prompt = [
            self._params(**request_params(params, n, seed, self.stop_ids))
            for seed in request_seeds(params.seed, len(prompts), n, params.prompt_offset)
        ]
        outputs = self._thread.call(
            lambda: llm.generate(requests, per_prompt, use_tqdm=False),
            self.config.generate_timeout_s,
            "generate",
            "generate_timeout_s",
        )
        return [completions_from_request(o) for o in outputs]

    def _check_lengths(self, ids: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        """A prompt whose completion cannot fit the engine's context would be cut short without
        a word (finish reason "length"); refuse it, naming the setting."""
        if self.max_model_len is None:
            return
        longest = max(len(x) for x in ids)
        if longest + max_new_tokens > self.max_model_len:
            raise ValueError(
                f"a prompt of {longest} tokens + max_new_tokens {max_new_tokens} exceeds the "
                f"vLLM engine's max_model_len {self.max_model_len}: raise sampler.max_model_len "
                "(or leave it unset, to size the engine from the stage's prompts)"
            )

    # ---- weight sync and sleep -----------------------------------------------------------------

    def sync_weights(self, model: torch.nn.Module, gather: Gather | None = None) -> SyncReport:
        """Load `model`'s current weights into the engine and reset its prefix cache, all within
        `sync_timeout_s`; `gather` makes partitioned parameters whole (default: by their kind).
        A sleeping engine's weights are woken first."""
        if self._sync is None:
            raise RuntimeError("this vLLM engine was started without weight_sync=True")
        self._open()
        if self._sleeping:
            self._wake(["weights"])
            self._weights_stale = True
        self._deadline = Deadline(self.config.sync_timeout_s, "weight sync", "sync_timeout_s")
        report = self._sync.sync(model, gather)
        self._weights_stale = False
        return report

    def sleep(self) -> bool:
        """Give the engine's device memory back (weights and KV cache discarded) until the next
        sync and generate; False when sleep mode is off (nothing is freed)."""
        if not self.config.sleep_mode or self._sync is None or self._sleeping:
            return False
        llm = self._open()
        self._thread.call(
            lambda: llm.sleep(level=SLEEP_LEVEL),
            self.config.sync_timeout_s,
            "sleep",
            "sync_timeout_s",
        )
        self._sleeping = True
        return True

    def _wake(self, tags: list[str]) -> None:
        """Wake the weights or the KV cache. vLLM allocates them through CUDA's own calls, not
        torch's allocator, so the blocks torch cached from the update are given back first
        (vLLM 0.10.2 does not do it itself, and its wake-up can run out of memory)."""
        llm = self._open()
        release_cached_memory()
        self._thread.call(
            lambda: llm.wake_up(tags=tags), self.config.sync_timeout_s, "wake-up", "sync_timeout_s"
        )
        if "kv_cache" in tags:
            self._sleeping = False

    def _load(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """One chunk to every worker. Workers in other processes (tensor parallel) get it
        through host memory; the in-process worker takes the tensors as they are."""
        assert self._deadline is not None
        llm = self._open()
        if self.config.tensor_parallel_size > 1:
            weights = [(name, tensor.to("cpu")) for name, tensor in weights]
        self._deadline.call(self._thread, lambda: llm.collective_rpc(LOAD_METHOD, args=(weights,)))

    def _reset_prefix_cache(self) -> None:
        """KV blocks cached for earlier prompts were computed with the old weights."""
        assert self._deadline is not None
        self._deadline.call(self._thread, self._open().reset_prefix_cache)

    # ---- closing -------------------------------------------------------------------------------

    def _open(self) -> Any:
        if self.llm is None:
            raise RuntimeError("this vLLM sampler is closed")
        return self.llm

    def close(self) -> None:
        """Shut the engine down and let go of it: its engine core (worker, weights, KV cache,
        the engine process if any) stopped, every reference to it dropped, the device cache
        emptied, an owned policy folder removed. Safe to call twice.

        An in-process engine core's shutdown also tears down torch.distributed's default group
        (vLLM's `cleanup_dist_env_and_memory`): a trainer closes its engine after its last
        collective."""
        llm, self.llm = self.llm, None
        if llm is not None:
            try:
                core = llm.llm_engine.engine_core
                self._thread.call(
                    core.shutdown, self.config.start_timeout_s, "shutdown", "start_timeout_s"
                )
            except Exception as error:  # the engine is let go of whatever its shutdown says
                log.warning("vLLM engine shutdown failed: %s", error)
            finally:
                self._thread.close()
                del llm
                self._sync = None
                gc.collect()
                release_cached_memory()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None

    def __enter__(self) -> VLLMSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
