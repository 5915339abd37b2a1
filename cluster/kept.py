"""Sampling actors kept from one stage to the next within a flow run.

A stage's sampling actors are Ray worker processes that import torch and transformers before
they load the stage's model: several seconds each on a small machine, and a run starts them for
every evaluation, the rejection sampling, the distillation traces and every GRPO stage. Within
`kept_actors(cluster)` (a flow's body) a stage that is done gives its actors back with its model
unloaded (cluster/actors.py `ActorSampler.close`), and the next stage on the same cluster
settings takes them and loads its own model: the processes are kept, never a model or a policy
version's weights.

Nothing is kept where it could get in another's way: a training stage's Ray placement
(cluster/ray_nodes.py) ends the kept actors first, since their CPUs and GPUs are what its bundles
need; actors given GPUs, or that sampled with vLLM, are ended after their stage as without a
block (an idle actor would keep its CUDA context on a card a training stage may use, and an
engine's process is not reused); and the block's end ends every kept actor, also when the flow
fails. Outside a block every stage starts and ends its own actors.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from configs.cluster import ClusterConfig
from configs.reinforcement import SamplerConfig

log = logging.getLogger(__name__)


@dataclass
class _Kept:
    """The open block's idle actors and the cluster settings they were started with."""

    key: tuple[Any, ...] | None = None
    actors: list[Any] = field(default_factory=list)


_LOCK = threading.Lock()
_BLOCK: _Kept | None = None  # None: no block is open


def settings_key(cluster: ClusterConfig) -> tuple[Any, ...]:
    """What an actor was started with: actors are taken only by a stage that would start the
    same ones."""
    return (
        cluster.address,
        cluster.workers,
        cluster.cpus_per_worker,
        cluster.gpus_per_worker,
        cluster.threads_per_worker,
        cluster.max_restarts,
    )


def keeps(cluster: ClusterConfig, sampler: SamplerConfig) -> bool:
    """Whether actors that sampled with `sampler` may wait for the next stage: hf sampling on
    CPUs only."""
    return sampler.backend == "hf" and cluster.gpus_per_worker == 0


@contextmanager
def kept_actors(cluster: ClusterConfig | None) -> Iterator[None]:
    """Keep sampling actors between the stages run inside; end them all at the end. Without a
    Ray cluster, with `cluster.keep_actors` off, or inside a block already open, it does
    nothing."""
    global _BLOCK
    if cluster is None or not cluster.uses_ray or not cluster.keep_actors:
        yield
        return
    with _LOCK:
        if _BLOCK is not None:
            opened = False
        else:
            _BLOCK, opened = _Kept(), True
    try:
        yield
    finally:
        if opened:
            release("the flow's end")
            with _LOCK:
                _BLOCK = None


def take(cluster: ClusterConfig) -> list[Any]:
    """The kept actors started with `cluster`'s settings (taken out of the block), or none."""
    with _LOCK:
        if _BLOCK is None or _BLOCK.key != settings_key(cluster):
            actors = []
        else:
            actors, _BLOCK.actors, _BLOCK.key = _BLOCK.actors, [], None
    if not actors:
        release("a stage on other cluster settings")
    return actors


def give_back(cluster: ClusterConfig, sampler: SamplerConfig, actors: list[Any]) -> bool:
    """Keep `actors` (their models unloaded) for the next stage; False where no block is open
    or they are not to be kept (`keeps`): the caller ends them."""
    if not keeps(cluster, sampler):
        return False
    with _LOCK:
        if _BLOCK is None:
            return False
        earlier, _BLOCK.actors, _BLOCK.key = _BLOCK.actors, list(actors), settings_key(cluster)
    _end(earlier)
    return True


def release(why: str) -> None:
    """End the kept actors, if any (`why` is logged)."""
    with _LOCK:
        if _BLOCK is None or not _BLOCK.actors:
            return
        actors, _BLOCK.actors, _BLOCK.key = _BLOCK.actors, [], None
    log.info("ending %d kept sampling actors: %s", len(actors), why)
    _end(actors)


def _end(actors: list[Any]) -> None:
    if actors:
        import ray

        for actor in actors:
            ray.kill(actor, no_restart=True)
