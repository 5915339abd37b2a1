"""A GRPO stage's rollouts drawn on the cluster's sampling actors (`cluster.workers` of them).

Each actor is a SamplerActor (cluster/actors.py: it loads the stage's model once, after checking
that its folder and its sampling code digest as the stage's process's do) drawing jobs: a step's
chunk of prompts and the policy version to sample it with, read from the stage's folder on the
shared filesystem and checked against the digest the trainer wrote
(sampling/workers/versions.py). An actor that dies is restarted by Ray (`max_restarts`) and the
jobs it held run again on the new one, which loads the stage's model and then the version the
job names: the rows are the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cluster.actors import ActorSampler, ClusterSamplingError
from configs.cluster import ClusterConfig
from configs.reinforcement import SamplerConfig
from sampling.workers import DrawJob, DrawResult, RolloutWorkerError


class ActorWorkers:
    """The actors as a pool of sampling workers (sampling/workers `Workers`): jobs go to the
    actor with the fewest in flight and come back as they finish."""

    def __init__(self, pool: ActorSampler):
        self.pool = pool
        self.size = len(pool.actors)
        self.running: dict[Any, tuple[int, DrawJob]] = {}  # object ref -> (actor, job)

    @classmethod
    def start(
        cls, cluster: ClusterConfig, config: SamplerConfig, model_path: Path, batch_size: int
    ) -> ActorWorkers:
        pool = ActorSampler.start(cluster, config, model_path, batch_size)
        return cls(pool)

    def submit(self, job: DrawJob) -> None:
        load = [0] * self.size
        for actor, _ in self.running.values():
            load[actor] += 1
        actor = load.index(min(load))
        self.running[self.pool.actors[actor].draw.remote(self.pool.spec, job)] = (actor, job)

    def result(self) -> DrawResult:
        config = self.pool.config
        limit = config.start_timeout_s + config.generate_timeout_s
        done, _ = self.pool.ray.wait(list(self.running), num_returns=1, timeout=limit)
        if not done:
            raise RolloutWorkerError(
                f"no rollouts came back from the sampling actors within {limit:g} s "
                f"(sampler.start_timeout_s + sampler.generate_timeout_s); {len(self.running)} "
                "jobs were out"
            )
        actor, job = self.running.pop(done[0])
        try:
            result: DrawResult = self.pool.collect(done[0], actor, f"step {job.step}")
        except ClusterSamplingError as error:
            raise RolloutWorkerError(str(error)) from error
        return result

    @property
    def pids(self) -> list[int]:
        return list(self.pool.pids)

    def close(self) -> None:
        self.pool.close()
