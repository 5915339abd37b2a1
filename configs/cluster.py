"""Where the pipeline's work runs when it outgrows one machine: the Ray cluster that samples,
and the nodes that training ranks span.

Placement is not identity: these settings never enter a stage key or a rollout key (the run
context carries them, and its part of a key is the state folder alone), because a run on one
worker and a run on many store the same rows and train the same weights. With `address` unset
and one node, nothing imports Ray and every stage runs as on one machine.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from configs.strict import Strict

DEFAULT_SHELL = ["ssh", "-o", "BatchMode=yes", "-tt", "{host}"]
Rollouts = Literal["colocated", "process", "workers"]


# what only a Ray cluster reads (`nodes` also splits a stage over `hosts`, without Ray)
RAY_ONLY = frozenset(
    {
        "workers", "cpus_per_worker", "gpus_per_worker", "threads_per_worker", "chunk_prompts",
        "max_restarts", "cpus_per_rank", "gpus_per_rank", "connect_timeout_s", "place_timeout_s",
        "keep_actors",
    }
)  # fmt: skip


class ClusterConfig(Strict):
    """The `cluster` section of a profile (docs/cluster.md)."""

    address: str | None = Field(
        None,
        description="the Ray cluster to sample on and place training nodes with: 'auto' (the "
        "cluster this machine joined with `ray start`) or HOST:PORT of its head; None: no Ray",
    )
    workers: int = Field(
        2, ge=1, description="sampling actors, each loading the stage's model once"
    )
    cpus_per_worker: float = Field(1.0, gt=0, description="Ray CPUs each sampling actor takes")
    gpus_per_worker: float = Field(
        0.0, ge=0, description="Ray GPUs each sampling actor takes (vLLM: tensor_parallel_size)"
    )
    threads_per_worker: int = Field(1, ge=1, description="torch threads of an hf sampling actor")
    chunk_prompts: int = Field(
        64,
        ge=1,
        description="evaluation prompts per chunk sent to an actor (rejection sampling keeps "
        "its own chunk_prompts, which sets its seeds)",
    )
    max_restarts: int = Field(
        3, ge=0, description="times a dead sampling actor is replaced, its chunks re-run"
    )
    keep_actors: bool = Field(
        True,
        description="keep the sampling actors from one stage to the next within a flow run (hf "
        "actors without GPUs; their models unloaded between stages), instead of starting and "
        "ending them at every stage",
    )
    nodes: int = Field(
        1, ge=1, description="machines a DeepSpeed stage's engine.processes are split over"
    )
    cpus_per_rank: float = Field(1.0, gt=0, description="Ray CPUs reserved per training rank")
    gpus_per_rank: float = Field(0.0, ge=0, description="Ray GPUs reserved per training rank")
    hosts: list[str] = Field(
        default_factory=list,
        description="without Ray: the training nodes' host names, node 0 (the rendezvous "
        "master) first; one per node",
    )
    remote_shell: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SHELL),
        description="without Ray: how a node's launch command reaches a host that is not this "
        "machine ({host} is replaced; the command is appended as one argument)",
    )
    rollouts: Literal["auto", "colocated", "process", "workers"] = Field(
        "auto",
        description="where GRPO stages draw their rollouts: the trainer's own sampler "
        "(colocated), one sampler process beside it on this machine (process), or the `workers` "
        "Ray actors (workers; needs address). auto: colocated for a stage with max_staleness 0, "
        "else workers with an address, else process",
    )
    connect_timeout_s: float = Field(
        30.0, gt=0, description="reaching the cluster's head before anything runs"
    )
    place_timeout_s: float = Field(
        300.0, gt=0, description="the cluster finding room for the actors or training nodes"
    )

    @property
    def uses_ray(self) -> bool:
        return self.address is not None

    def active(self) -> ClusterConfig | None:
        """This section where it asks for anything beyond one process, else None."""
        beyond = self.uses_ray or self.nodes > 1 or self.rollouts in ("process", "workers")
        return self if beyond else None

    def rollouts_for(self, max_staleness: int, engine_kind: str) -> Rollouts:
        """Where a GRPO stage with these settings draws its rollouts; an impossible pairing is
        an error naming both settings."""
        if self.rollouts == "auto":
            if max_staleness == 0:
                return "colocated"
            return "workers" if self.uses_ray else "process"
        if self.rollouts == "colocated" and max_staleness:
            raise ValueError(
                f"cluster.rollouts is colocated, but max_staleness {max_staleness} needs sampling "
                "workers that draw while the trainer updates: set cluster.rollouts to process, "
                "workers or auto"
            )
        if self.rollouts != "colocated" and engine_kind == "deepspeed":
            raise ValueError(
                f"cluster.rollouts is {self.rollouts}, but DeepSpeed ranks sample with their "
                "colocated samplers: set it to auto or colocated, or use engine.kind single"
            )
        return self.rollouts

    @model_validator(mode="after")
    def _ray_settings_need_ray(self) -> ClusterConfig:
        """A setting that only a Ray cluster reads, given without `address` and away from its
        default, would do nothing (a whole config written out by `r1 config` names every setting
        at its default: that one loads)."""
        fields = type(self).model_fields
        changed = {n for n in self.model_fields_set if getattr(self, n) != fields[n].default}
        unused = sorted(RAY_ONLY & changed) if self.address is None else []
        if unused:
            names = ", ".join(f"cluster.{name}" for name in unused)
            raise ValueError(
                f"{names}: only a Ray cluster reads {'it' if len(unused) == 1 else 'them'}, and "
                "cluster.address is not set, so it would do nothing: add cluster.address=auto "
                "(the cluster this machine joined) or cluster.address=HOST:PORT"
            )
        return self

    @model_validator(mode="after")
    def _nodes_have_a_launcher(self) -> ClusterConfig:
        if self.nodes > 1 and self.address is None and len(self.hosts) != self.nodes:
            raise ValueError(
                f"nodes is {self.nodes}: set address (Ray places the nodes) or list one host "
                f"per node in hosts (got {len(self.hosts)})"
            )
        if self.hosts and self.address is not None:
            raise ValueError("give address (Ray places the nodes) or hosts, not both")
        if self.rollouts == "workers" and self.address is None:
            raise ValueError("rollouts: workers are Ray actors; set address (or rollouts: process)")
        if not self.remote_shell:
            raise ValueError("remote_shell must name a command, e.g. ssh {host}")
        return self
