"""What a stage samples with and where its training ranks start, given the profile's `cluster`
section (None, or no address and one node: this machine, exactly as without the section)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from configs.cluster import ClusterConfig
from configs.reinforcement import GRPOConfig, SamplerConfig
from rl.sources import RolloutSource
from rl.sources.pipelined import PipelinedSource
from sampling.factory import Sampler, open_sampler
from sampling.workers.process import ProcessWorkers
from training.distributed import NodeLauncher
from training.nodes import HostNodes


def stage_sampler(
    config: SamplerConfig,
    model_path: Path,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    cluster: ClusterConfig | None = None,
) -> Sampler:
    """The sampler of an evaluation or rejection-sampling stage: the configured one in this
    process, or, on a Ray cluster, `cluster.workers` actors that each load the model once and
    sample chunks of the prompts (cluster.actors)."""
    if cluster is None or not cluster.uses_ray:
        return open_sampler(config, model_path, tokenizer, batch_size)
    from cluster.actors import ActorSampler

    return ActorSampler.start(cluster, config, Path(model_path), batch_size)


def rollout_source(
    config: GRPOConfig, model_path: Path, out_dir: Path, cluster: ClusterConfig | None
) -> RolloutSource | None:
    """Where a GRPO stage draws its rollouts (`cluster.rollouts`): None, the trainer's own
    sampler; else sampling workers over the model at `model_path` (its architecture and
    tokenizer; each draw's weights are a policy version the trainer writes under `out_dir`): a
    sampler process on this machine, or `cluster.workers` Ray actors."""
    cluster = cluster or ClusterConfig()
    where = cluster.rollouts_for(config.max_staleness, config.engine.kind)
    if where == "colocated":
        return None
    batch = config.prompts_per_step * config.group_size
    if where == "workers":
        from cluster.rollout_actors import ActorWorkers

        workers: Any = ActorWorkers.start(cluster, config.sampler, model_path, batch)
    else:
        workers = ProcessWorkers(
            config.sampler,
            model_path,
            batch,
            threads=cluster.threads_per_worker,
            max_restarts=cluster.max_restarts,
        )
    versions = out_dir / "policy_versions"
    return PipelinedSource(workers, versions, config.max_staleness, config.steps)


def training_nodes(cluster: ClusterConfig | None) -> NodeLauncher | None:
    """Who starts a DeepSpeed stage's ranks over `cluster.nodes` machines: Ray (a placement
    group, one bundle per node) or the listed hosts; None: this machine alone."""
    if cluster is None or cluster.nodes == 1:
        return None
    if cluster.uses_ray:
        from cluster.ray_nodes import RayNodes

        return RayNodes(cluster)
    return HostNodes(cluster.hosts, cluster.remote_shell)


def close_sampler(sampler: Sampler) -> None:
    """Release what a stage's sampler holds (actors, an engine), where it holds anything."""
    close = getattr(sampler, "close", None)
    if callable(close):
        close()
