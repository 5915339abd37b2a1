"""Sampling on a Ray cluster: `cluster.workers` actors, each loading the stage's model once,
sampling the chunks of prompts the stage's process sends them.

Rows are the same as one process's because a prompt's samples depend only on its stream
(sampling/streams.py: seed, prompt index, sample index): a chunk carries its prompts' global
index in `prompt_offset` (evaluation) or its own seed (rejection sampling), so which actor
samples it, and beside which other prompts, changes nothing.

Every call to an actor carries the stage's `ModelSpec` (sampler settings, model folder and its
digests, batch size), and an actor holding no model, or another, loads that one first: so an
actor can outlive its stage and serve the next (cluster/kept.py keeps them within a flow run).

Faults: an actor that dies is restarted by Ray (`max_restarts`) on whatever node has room, loads
the model again and re-runs the chunks it held (`max_task_retries`); the stage sees the same
results. Every wait is bounded: actors must be ready within the sampler's `start_timeout_s`
and some chunk must come back within `start_timeout_s + generate_timeout_s` (a restarted
actor loads its model again before it samples). An actor whose model folder does not hold the
driver's model (another checkpoint at that path, or no shared filesystem) fails at once.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from configs.cluster import ClusterConfig
from configs.reinforcement import SamplerConfig
from host.threads import runtime_threads, thread_vars
from sampling.chunks import ChunkJob
from sampling.interface import Completion, SamplingParams
from sampling.workers import DrawJob, DrawResult
from storage.digests import tree_digest

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
SAMPLING_CODE = ("configs", "models", "sampling")  # what decides a sample, digested on both sides
IN_FLIGHT = 2  # chunks queued per actor, so it never waits for the driver between two


class ModelMismatchError(RuntimeError):
    """A sampling actor sees another model (or other sampling code) than the stage's process."""


class ClusterSamplingError(RuntimeError):
    """Sampling on the cluster failed for a reason other than the model."""


@dataclass(frozen=True)
class ChunkResult:
    groups: list[list[Completion]]
    seconds: float  # the actor's time in generate
    pid: int
    node: str


def code_digest() -> str:
    """Digest of the sampling code (configs, models, sampling packages' sources)."""
    h = hashlib.sha256()
    for package in SAMPLING_CODE:
        for path in sorted((ROOT / package).rglob("*.py")):
            h.update(path.relative_to(ROOT).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class ModelSpec:
    """What a stage samples with: its sampler settings, the model folder (with the digests the
    stage's process found for it and for its sampling code) and the batch size. Every call to an
    actor carries it, so that an actor Ray restarted, or one kept from an earlier stage
    (cluster.kept), loads the stage's model before it samples."""

    config: SamplerConfig
    model_path: str
    digests: dict[str, str]
    batch: int


class SamplerActor:
    """One sampler on one node (made a Ray actor by `ActorSampler.start`): a worker process with
    `threads` torch threads that loads the model a call's `ModelSpec` names, when it holds no
    other, and samples chunks with it (`generate`) or draws GRPO jobs at the policy version each
    names (`draw`). Its constructor loads nothing and never raises: a restarted actor is ready
    for the next call, which loads the stage's model again."""

    def __init__(self, threads: int):
        self.node = socket.gethostname()
        self.threads = threads
        self.spec: ModelSpec | None = None
        self.sampler: Any = None
        self.worker: Any = None  # the RolloutWorker of `draw`, made on its first job
        self.load_seconds = 0.0

    def _take(self, spec: ModelSpec) -> None:
        """Hold `spec`'s model, loading it (after checking its digests) unless held already."""
        if self.spec == spec:
            return
        self.unload()
        began = time.perf_counter()
        self._check(Path(spec.model_path), spec.digests)
        self.sampler = self._open(spec.config, Path(spec.model_path), spec.batch, self.threads)
        self.spec = spec
        self.load_seconds = time.perf_counter() - began

    def _check(self, path: Path, digests: dict[str, str]) -> None:
        where = f"sampling actor on {self.node} (pid {os.getpid()})"
        if not path.is_dir():
            raise ModelMismatchError(
                f"{where}: no model folder at {path}. The state folder must be on a shared "
                "filesystem that every node of the cluster sees at the same path (docs/cluster.md)"
            )
        found = tree_digest(path)
        if found != digests["model"]:
            raise ModelMismatchError(
                f"{where}: the model at {path} has digest {found[:12]}, the stage's process has "
                f"{digests['model'][:12]}: this node sees another folder at that path. Share "
                "the state folder at the same path on every node (docs/cluster.md)"
            )
        code = code_digest()
        if code != digests["code"]:
            raise ModelMismatchError(
                f"{where}: its sampling code ({ROOT}) differs from the stage's process "
                f"(digest {code[:12]} against {digests['code'][:12]}): run the same checkout "
                "on every node"
            )

    @staticmethod
    def _open(config: SamplerConfig, path: Path, batch: int, threads: int) -> Any:
        import torch

        from models.loading import load_tokenizer, use_device
        from sampling.factory import open_sampler

        use_device(actor_device())  # a node without the GPU Ray promised refuses here
        torch.set_num_threads(threads)
        os.environ.setdefault("TQDM_DISABLE", "1")  # progress is the stage's, per chunk
        return open_sampler(config, path, load_tokenizer(path), batch)

    def open(self, spec: ModelSpec) -> dict[str, Any]:
        """Load `spec`'s model; where this actor runs and what loading took."""
        self._take(spec)
        from models.loading import model_device

        return {
            "node": self.node,
            "pid": os.getpid(),
            "load_seconds": self.load_seconds,
            "threads": runtime_threads(),
            "device": model_device().type,
        }

    def generate(
        self, spec: ModelSpec, prompts: list[str], n: int, params: SamplingParams
    ) -> ChunkResult:
        self._take(spec)
        began = time.perf_counter()
        groups = self.sampler.generate(prompts, n, params)
        return ChunkResult(groups, time.perf_counter() - began, os.getpid(), self.node)

    def draw(self, spec: ModelSpec, job: DrawJob) -> DrawResult:
        """A GRPO step's chunk, sampled with the policy version `job` names (loaded into the
        model first when it holds another; cluster/rollout_actors.py)."""
        from sampling.workers.worker import RolloutWorker

        self._take(spec)
        if self.worker is None:
            self.worker = RolloutWorker.around(self.sampler, Path(spec.model_path))
        result: DrawResult = self.worker.draw(job)
        return result

    def unload(self) -> None:
        """Close the sampler and let its model go; the process stays for the next model."""
        close = getattr(self.sampler, "close", None)
        if callable(close):
            close()
        self.spec, self.sampler, self.worker = None, None, None
        gc.collect()


@dataclass
class ActorSampler:
    """The stage's sampler on a cluster: `generate` splits its prompts into chunks over the
    actors and returns them in order; `run_chunks` yields whole chunks as they come back."""

    ray: Any
    actors: list[Any]
    cluster: ClusterConfig
    spec: ModelSpec
    pids: list[int]
    startup: list[dict[str, Any]]
    replaced: list[tuple[int, int, int]] = field(default_factory=list)  # (actor, old pid, new)

    @classmethod
    def start(
        cls,
        cluster: ClusterConfig,
        config: SamplerConfig,
        model_path: Path,
        batch_size: int,
        digest: str | None = None,
    ) -> ActorSampler:
        """`cluster.workers` actors, each with the model at `model_path` loaded, once every one
        has checked that its folder holds `digest` (default: the folder's digest here). The
        actors a `kept_actors` block holds from an earlier stage are taken first (cluster.kept)."""
        from cluster import kept
        from cluster.connect import connect

        ray = connect(cluster)
        _warn_if_gpus_idle(cluster)
        digests = {"model": digest or tree_digest(model_path), "code": code_digest()}
        spec = ModelSpec(config, str(model_path.resolve()), digests, batch_size)
        held = kept.take(cluster)
        if held:
            from ray.exceptions import RayActorError

            try:
                return cls._opened(ray, held, cluster, spec, "kept from the stage before")
            except RayActorError as error:
                first = str(error).splitlines()[0] if str(error) else type(error).__name__
                log.warning("a kept sampling actor had died (%s): starting new ones", first)
        return cls._opened(ray, new_actors(ray, cluster), cluster, spec, "started")

    @classmethod
    def _opened(
        cls, ray: Any, actors: list[Any], cluster: ClusterConfig, spec: ModelSpec, how: str
    ) -> ActorSampler:
        """The sampler over `actors` once each has loaded `spec`'s model; on any failure the
        actors are ended and the error raised."""
        try:
            startup = _wait_ready(ray, actors, spec, cluster)
        except BaseException:
            for actor in actors:
                ray.kill(actor)
            raise
        log.info(
            "%d sampling actors (%s) ready on %s, sampling on %s",
            len(actors),
            how,
            ", ".join(sorted({s["node"] for s in startup})),
            ", ".join(sorted({s["device"] for s in startup})),
        )
        return cls(ray, actors, cluster, spec, [s["pid"] for s in startup], startup)

    @property
    def config(self) -> SamplerConfig:
        return self.spec.config

    def generate(
        self, prompts: Sequence[str], n: int, params: SamplingParams
    ) -> list[list[Completion]]:
        """n completions per prompt, in prompt order: chunks of `cluster.chunk_prompts`, each
        with the global index of its first prompt as its offset."""
        size = self.cluster.chunk_prompts
        jobs = [
            ChunkJob(
                list(prompts[i : i + size]),
                n,
                _shifted(params, params.prompt_offset + i),
            )
            for i in range(0, len(prompts), size)
        ]
        results: dict[int, list[list[Completion]]] = dict(self.run_chunks(jobs))
        return [group for index in range(len(jobs)) for group in results[index]]

    def run_chunks(self, jobs: Sequence[ChunkJob]) -> Iterator[tuple[int, list[list[Completion]]]]:
        """(job index, its groups) for every job, in the order they finish."""
        for index, result in self.run_chunk_results(jobs):
            yield index, result.groups

    def run_chunk_results(self, jobs: Sequence[ChunkJob]) -> Iterator[tuple[int, ChunkResult]]:
        pending = deque(enumerate(jobs))
        running: dict[Any, tuple[int, int]] = {}  # object ref -> (actor, job index)

        def submit(actor: int) -> None:
            if pending:
                index, job = pending.popleft()
                ref = self.actors[actor].generate.remote(self.spec, job.prompts, job.n, job.params)
                running[ref] = (actor, index)

        for actor in range(len(self.actors)):
            for _ in range(IN_FLIGHT):
                submit(actor)
        limit = self.config.start_timeout_s + self.config.generate_timeout_s
        while running:
            done, _ = self.ray.wait(list(running), num_returns=1, timeout=limit)
            if not done:
                raise ClusterSamplingError(
                    f"no chunk came back from the sampling actors within {limit:g} s "
                    f"(sampler.start_timeout_s + sampler.generate_timeout_s); "
                    f"{len(running)} chunks were out. Raise those limits if sampling is only slow"
                )
            actor, index = running.pop(done[0])
            result = self.collect(done[0], actor, f"chunk {index}")
            submit(actor)
            yield index, result

    def collect(self, ref: Any, actor: int, what: str) -> Any:
        """The result of `ref`, a call of actor `actor` that computes `what`; a replaced actor
        (another pid than before) is logged and remembered."""
        from ray.exceptions import RayActorError, RayTaskError

        try:
            result = self.ray.get(ref)
        except RayTaskError as error:
            raise task_error(error) from None
        except RayActorError as error:
            raise ClusterSamplingError(
                f"sampling actor {actor} died more than cluster.max_restarts "
                f"({self.cluster.max_restarts}) times; {what} was not sampled: {error}"
            ) from error
        if result.pid != self.pids[actor]:
            log.warning(
                "sampling actor %d was replaced (pid %d -> %d on %s) and re-ran its chunks",
                actor,
                self.pids[actor],
                result.pid,
                result.node,
            )
            self.replaced.append((actor, self.pids[actor], result.pid))
            self.pids[actor] = result.pid
        return result

    def close(self) -> None:
        """Unload each actor's model; keep the actors for the next stage where a `kept_actors`
        block takes them (cluster.kept), else end them."""
        from cluster import kept

        unloading = [actor.unload.remote() for actor in self.actors]
        done, _ = self.ray.wait(unloading, num_returns=len(unloading), timeout=60)
        unloaded = len(done) == len(unloading) and _all_returned(self.ray, done)
        if not (unloaded and kept.give_back(self.cluster, self.spec.config, self.actors)):
            for actor in self.actors:
                self.ray.kill(actor, no_restart=True)
        self.actors = []


def new_actors(ray: Any, cluster: ClusterConfig) -> list[Any]:
    """`cluster.workers` sampling actors, holding no model yet."""
    remote = ray.remote(
        num_cpus=cluster.cpus_per_worker,
        num_gpus=cluster.gpus_per_worker,
        max_restarts=cluster.max_restarts,
        max_task_retries=cluster.max_restarts,
        scheduling_strategy="SPREAD",
        runtime_env=actor_env(cluster.threads_per_worker),
    )(SamplerActor)
    return [remote.remote(cluster.threads_per_worker) for _ in range(cluster.workers)]


def _all_returned(ray: Any, refs: list[Any]) -> bool:
    """Whether every call behind `refs` returned (none raised, no actor died)."""
    try:
        ray.get(refs)
    except Exception:
        return False
    return True


def actor_device() -> str:
    """Where a sampling actor's hf model runs: "cuda" when Ray gave the actor GPUs
    (`cluster.gpus_per_worker` > 0; Ray names them in CUDA_VISIBLE_DEVICES), else "cpu"."""
    import ray

    return "cuda" if ray.get_gpu_ids() else "cpu"


def _warn_if_gpus_idle(cluster: ClusterConfig) -> None:
    """Say so when this process trains on a GPU while its sampling actors, given none, would
    sample on their nodes' CPUs."""
    from models.loading import model_device

    if model_device().type == "cuda" and cluster.gpus_per_worker == 0:
        log.warning(
            "the profile trains on cuda but cluster.gpus_per_worker is 0: the %d sampling "
            "actors sample on their nodes' CPUs. Give each a GPU (cluster.gpus_per_worker: 1) "
            "to sample on the cluster's GPUs",
            cluster.workers,
        )


def _shifted(params: SamplingParams, offset: int) -> SamplingParams:
    return replace(params, prompt_offset=offset)


def task_error(error: Exception) -> Exception:
    """What an actor's call raised (a ModelMismatchError, the sampler's own error), as raised
    there: Ray wraps it in a RayTaskError."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, Exception) else error


def _wait_ready(
    ray: Any, actors: list[Any], spec: ModelSpec, cluster: ClusterConfig
) -> list[dict[str, Any]]:
    """Each actor's node, pid and load time, once all loaded `spec`'s model; a mismatch or a
    cluster without room fails here, before any chunk is sent."""
    from ray.exceptions import GetTimeoutError, RayTaskError

    limit = cluster.place_timeout_s + spec.config.start_timeout_s
    try:
        return ray.get([actor.open.remote(spec) for actor in actors], timeout=limit)
    except RayTaskError as error:
        raise task_error(error) from None
    except GetTimeoutError as error:
        raise ClusterSamplingError(
            f"{len(actors)} sampling actors ({cluster.cpus_per_worker:g} CPUs, "
            f"{cluster.gpus_per_worker:g} GPUs each) were not ready within {limit:g} s "
            "(cluster.place_timeout_s + sampler.start_timeout_s): the cluster lacks room for "
            "them, or loading the model is that slow"
        ) from error


def actor_env(threads: int) -> dict[str, Any]:
    """The Ray runtime environment of an actor that runs `threads` torch threads: passive
    OpenMP waiting and its thread count, in the worker process's environment from its start
    (a Ray worker imports torch long before it runs an actor's code; host/threads.py)."""
    return {"env_vars": thread_vars(threads)}
