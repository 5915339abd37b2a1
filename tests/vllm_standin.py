"""A stand-in for vLLM's offline engine, for tests on machines where vLLM cannot run.

vLLM has no CPU wheel, so these objects take the place of `vllm.LLM` and `vllm.SamplingParams`
behind VLLMSampler (sampling/vllm.py). They are written from vLLM 0.33.0's source and do what
it does where our code depends on it, around a real transformers model loaded from the engine's
model folder:
- start: refuses when free device memory is below `gpu_memory_utilization` of the total
  (`v1/worker/utils.py` `request_memory`), so an engine that was never shut down blocks the
  next; the device is one shared account (`Device`), and the class counts live engines but
  keeps no reference to any (`instances` are weak references);
- an in-process engine (`distributed_executor_backend="external_launcher"`) needs RANK,
  LOCAL_RANK, MASTER_ADDR and MASTER_PORT (`v1/executor/uniproc_executor.py`), joins or starts
  torch.distributed (gloo here, where vLLM falls back to it without NCCL), and changes the
  process: reseeds random, NumPy and torch (`set_random_seed`), sets the float32 matmul
  precision, `gc.freeze()`s and writes `VLLM_ENABLE_V1_MULTIPROCESSING=0`;
- `llm_engine.engine_core.shutdown()`: releases the memory, unfreezes the GC and, in-process,
  destroys torch.distributed's default group (`cleanup_dist_env_and_memory`);
- `generate`: sample j of a request seeded s is drawn with the seed s + j
  (`v1/engine/parallel_sampling.py`), each from its own stream; the seeds used are recorded;
- `sleep(level)`, `wake_up(tags)`: level 2 discards the weights (here: NaN) and keeps the
  buffers; a generate while asleep is refused;
- `collective_rpc(method, args=...)` on one worker object with our WeightLoadExtension mixed in;
  the model's `load_weights` reads checkpoint names and skips `lm_head.*` when the embeddings
  are tied, as vLLM's Qwen2 and Llama models do;
- `reset_prefix_cache()`, counted.
Calls can be made to sleep (a hang) or raise, to test the time limits.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import threading
import weakref
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

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


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


@dataclass
class Device:
    """One GPU's memory, as shares of its total, held by engines that are awake."""

    held: dict[int, float] = field(default_factory=dict)  # id(engine) -> share
    # what torch's caching allocator keeps of its freed blocks (a training update's, say): vLLM
    # allocates its sleep-mode memory through CUDA's own calls, so torch's cache is not free to it
    torch_cache: float = 0.0

    @property
    def free(self) -> float:
        return 1.0 - sum(self.held.values()) - self.torch_cache

    def empty_torch_cache(self) -> None:
        """`torch.cuda.empty_cache()`: torch's cached blocks go back to the device."""
        self.torch_cache = 0.0

    def take(self, owner: object, share: float) -> None:
        free = self.free + self.held.get(id(owner), 0.0)  # what it holds already counts
        if free + 1e-9 < share:
            raise ValueError(
                f"Free memory on device cuda:0 ({free:.2f}/1.00 of the total) on startup is "
                f"less than desired GPU memory utilization ({share}). Decrease GPU memory "
                "utilization or reduce GPU memory used by other processes."
            )
        self.held[id(owner)] = share

    def give_back(self, owner: object) -> None:
        self.held.pop(id(owner), None)


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


class EngineCore:
    """`LLM.llm_engine.engine_core`: what shutdown reaches."""

    def __init__(self, llm: StandInLLM):
        self._llm = weakref.ref(llm)

    def shutdown(self) -> None:
        llm = self._llm()
        if llm is not None:
            llm.shut_down()


def in_process(kwargs: dict[str, Any]) -> bool:
    return kwargs.get("distributed_executor_backend") == "external_launcher"


class StandInLLM:
    """`vllm.LLM(**kwargs)`; the model folder is `kwargs["model"]`."""

    instances: list[weakref.ref[StandInLLM]] = []  # every engine started, weakly
    live = 0  # started and not shut down
    device = Device()
    behaviour = Behaviour()
    seeds_drawn: list[int] = []  # the seed of every sample any engine drew, in order
    imported = False  # `import vllm` ran in this process (standin_api)

    @classmethod
    def reset(cls) -> None:
        cls.instances, cls.live, cls.device, cls.behaviour = [], 0, Device(), Behaviour()
        cls.seeds_drawn = []
        cls.imported = False

    @classmethod
    def last(cls) -> StandInLLM:
        """The engine started last (it must still be referenced somewhere)."""
        engine = cls.instances[-1]()
        assert engine is not None, "the last engine was let go of"
        return engine

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        self.behaviour.act("start")
        self.device.take(self, kwargs.get("gpu_memory_utilization", 0.9))
        if in_process(kwargs):
            self._start_in_process(kwargs.get("seed", 0))
        self.tokenizer = load_tokenizer(kwargs["model"])
        self.model: torch.nn.Module | None = load_model(kwargs["model"]).eval()
        self.worker = StandInWorker(self.model)
        self.llm_engine = SimpleNamespace(engine_core=EngineCore(self))
        self.prefix_resets = 0
        self.requests: list[tuple[list[int], dict]] = []
        self.child_seeds: list[int] = []  # the seed of every sample drawn, in order
        self.trainer_model: torch.nn.Module | None = None  # set by a test, to compare weights
        self.staleness: list[float] = []  # max |engine - trainer| weight at each generate
        self.asleep: int = 0  # the sleep level, 0 awake
        self.sleeps = 0
        self.alive = True
        StandInLLM.live += 1
        StandInLLM.instances.append(weakref.ref(self))

    def _start_in_process(self, seed: int) -> None:
        """What vLLM's external launcher does to the calling process while it starts."""
        missing = [key for key in LAUNCHER_VARS if key not in os.environ]
        if missing:
            raise KeyError(f"external_launcher needs {missing} (torchrun's variables)")
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(
                "gloo",
                init_method="env://",
                world_size=int(os.environ.get("WORLD_SIZE", "1")),
                rank=int(os.environ["RANK"]),
            )
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        random.seed(seed)
        with contextlib.suppress(ImportError):
            import numpy

            numpy.random.seed(seed)
        torch.manual_seed(seed)
        torch.set_float32_matmul_precision("highest")
        gc.freeze()

    def shut_down(self) -> None:
        if not self.alive:
            return
        self.alive = False
        self.device.give_back(self)
        StandInLLM.live -= 1
        self.model = None
        self.worker = None  # type: ignore[assignment]
        gc.unfreeze()
        if in_process(self.kwargs) and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # vLLM's cleanup_dist_env_and_memory

    @property
    def engine_model(self) -> EngineModel:
        return self.worker.model_runner.model

    def get_tokenizer(self):
        return self.tokenizer

    def _check_awake(self) -> torch.nn.Module:
        if not self.alive or self.model is None:
            raise RuntimeError("the engine was shut down")
        if self.asleep:
            raise RuntimeError("the engine is asleep: wake_up() before generating")
        return self.model

    def generate(self, requests: list[dict], params: list[dict], use_tqdm: bool = True):
        self.behaviour.act("generate")
        model = self._check_awake()
        if self.trainer_model is not None:
            self.staleness.append(max_difference(model, self.trainer_model))
        return [
            self._request(model, r["prompt_token_ids"], p)
            for r, p in zip(requests, params, strict=True)
        ]

    def _request(self, model: torch.nn.Module, ids: list[int], p: dict) -> SimpleNamespace:
        self.requests.append((list(ids), p))
        n = p["n"]
        seeds = [p["seed"] + j for j in range(n)]  # parallel_sampling: child j gets seed + j
        self.child_seeds += seeds
        StandInLLM.seeds_drawn += seeds
        keys = torch.cat([row_keys(s, torch.zeros(1), torch.zeros(1)) for s in seeds])
        done = decode(
            model,
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

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if not self.kwargs.get("enable_sleep_mode"):
            raise RuntimeError("Sleep mode is not enabled: start the engine with it")
        model = self._check_awake()
        if level == 2:
            with torch.no_grad():
                for param in model.parameters():
                    param.fill_(float("nan"))  # discarded; the buffers are kept
        self.asleep = level
        self.sleeps += 1
        self.device.give_back(self)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        share = self.kwargs.get("gpu_memory_utilization", 0.9)
        free = self.device.free + self.device.held.get(id(self), 0.0)
        if free + 1e-9 < share:  # CuMemAllocator's cuMemCreate failing
            raise RuntimeError(f"CUDA Error: out of memory (waking up with {free:.2f} free)")
        if "kv_cache" in (tags or ["kv_cache"]):
            self.asleep = 0
        self.device.take(self, share)
        return self.asleep == 0

    def collective_rpc(self, method: str, timeout: float | None = None, args=(), kwargs=None):
        self.behaviour.act("rpc")
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def reset_prefix_cache(self) -> bool:
        self.prefix_resets += 1
        return True


def sampling_params(**kwargs: Any) -> dict:
    """`vllm.SamplingParams(**kwargs)`: kept as the dict of what was asked."""
    return dict(kwargs)


# What `import vllm` writes into the environment (vllm/env_override.py, 0.33.0), the first time
IMPORT_VARIABLES = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def standin_api() -> VLLMApi:
    """`import vllm`: its import-time variables set, once per process (a test is one here)."""
    if not StandInLLM.imported:
        os.environ.update(IMPORT_VARIABLES)
        StandInLLM.imported = True
    return VLLMApi(StandInLLM, sampling_params)


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """Largest absolute difference between two models' weights of the same names."""
    theirs = dict(b.named_parameters())
    return max(float((p - theirs[n]).detach().abs().max()) for n, p in a.named_parameters())
