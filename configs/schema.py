"""One validated config object per stage; together they make a pipeline profile
(`PipelineConfig`). The stages' configs live by kind: configs.data, configs.supervised,
configs.reinforcement; this module holds rejection sampling, distillation, faults and the
profile that brings them together. Unknown keys are refused (a typo must not silently fall back
to a default) and models are frozen so the object that MLflow logs is the object that ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from configs.cluster import ClusterConfig
from configs.data import DataConfig
from configs.faults import FaultConfig, plant_hacks
from configs.reinforcement import (
    EvalConfig,
    GRPOConfig,
    RewardModelConfig,
    RewardTerm,
    SamplerConfig,
    verifier_terms,
)
from configs.strict import HOW_IT_RUNS, Strict, hub_id_field
from configs.supervised import (
    BootstrapConfig,
    CurationConfig,
    EngineConfig,
    ModelConfig,
    SFTConfig,
    TrainConfig,
)
from contracts.reward_names import PREFERENCE


class FunnelConfig(Strict):
    """Stage 4's SQL filters over the stored rollouts (storage.rollout_store), in this order.

    None (or False) disables a filter; a disabled filter still appears in the funnel, with
    rows_in == rows_out.
    """

    min_completion_tokens: int = Field(1, ge=0)
    max_completion_tokens: int = Field(4096, ge=1, description="and finish_reason must be 'stop'")
    require_correct: bool = Field(True, description="reasoning rows: reward_accuracy >= 1")
    require_well_formed: bool = Field(True, description="every row: reward_format >= 1")
    min_language_share: float | None = Field(0.95, ge=0, le=1, description="on reward_language")
    min_general_score: float | None = Field(
        None, description="general rows: reward_preference at least this; None: no bar"
    )
    dedup: bool = Field(True, description="one copy of each normalised completion per prompt")
    top_k: int | None = Field(4, ge=1, description="best k per prompt, by total reward")

    @model_validator(mode="after")
    def _bounds(self) -> FunnelConfig:
        if self.min_completion_tokens > self.max_completion_tokens:
            raise ValueError(
                f"min_completion_tokens ({self.min_completion_tokens}) exceeds "
                f"max_completion_tokens ({self.max_completion_tokens})"
            )
        return self


class RejectionConfig(Strict):
    """Stage 4 (and stage 7 traces): G completions per prompt into DuckDB, filtered by SQL."""

    reasoning_prompts: int | None = Field(None, ge=1, description="None: every training problem")
    general_prompts: int = Field(0, ge=0)
    samples_per_prompt: int = Field(4, ge=1)
    temperature: float = Field(0.7, gt=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_new_tokens: int = Field(200, ge=1)
    batch_size: Annotated[int, HOW_IT_RUNS] = Field(128, ge=1)
    sampler: SamplerConfig = SamplerConfig()
    chunk_prompts: int = Field(64, ge=1, description="prompts per committed DuckDB chunk")
    rewards: list[RewardTerm] = Field(
        default_factory=lambda: [
            *verifier_terms(),
            RewardTerm(name="format"),
            RewardTerm(name="language"),
        ]
    )
    funnel: FunnelConfig = FunnelConfig()
    seed: int = 0


class StudentConfig(Strict):
    """A distillation student: a smaller Qwen2- or Llama-architecture model.

    In the tiny world its base is cut from the bootstrap model (`base_layers`) or pretrained on
    the bootstrap corpus (`model`, `pretrain`), or both; with real checkpoints `path` names a
    local folder and no pretraining runs.
    """

    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9_]{0,39}$",
        description="lower-case letters, digits and '_': it names the student's stages "
        "(student_NAME) and folders, and its model's alias (student-NAME)",
    )
    model: ModelConfig | None = None
    pretrain: TrainConfig | None = Field(
        TrainConfig(),
        description="pretraining on the bootstrap corpus; none: a student cut from the base "
        "(base_layers) starts as cut",
    )
    base_layers: list[int] | None = Field(
        None,
        description="start from these layers of the bootstrap model, in order (its widths), "
        "instead of random weights: a student cut from the base",
    )
    path: Path | None = None
    hub_id: str | None = hub_id_field()

    @model_validator(mode="after")
    def _one_source(self) -> StudentConfig:
        if (self.model is None) == (self.path is None):
            raise ValueError(f"student {self.name!r}: give either model (tiny world) or path")
        if self.base_layers is not None and self.model is None:
            raise ValueError(f"student {self.name!r}: base_layers needs model (the tiny world)")
        if self.model is not None and self.base_layers is None and self.pretrain is None:
            raise ValueError(
                f"student {self.name!r}: a student of fresh weights needs pretrain (or base_layers)"
            )
        return self


class OnPolicyDistillConfig(Strict):
    """On-policy distillation from a teacher that shares the student's tokenizer."""

    steps: int = Field(40, ge=1)
    prompts_per_step: int = Field(8, ge=1)
    samples_per_prompt: int = Field(4, ge=1)
    max_new_tokens: int = Field(160, ge=1)
    temperature: float = Field(1.0, gt=0, description="sampling only; the KL is at temperature 1")
    learning_rate: float = Field(
        3e-5, gt=0, description="tiny world: 1e-4 already made the KL curve noisier"
    )
    max_grad_norm: float = Field(1.0, gt=0)
    estimator: Literal["full", "sampled"] = Field(
        "full", description="full: exact KL over the vocabulary; sampled: per-token policy gradient"
    )
    discount: float = Field(
        0.0,
        ge=0,
        le=1,
        description="0: each position's KL alone (Thinking Machines); 1: sequence-level KL",
    )
    micro_batch_size: Annotated[int, HOW_IT_RUNS] = Field(
        16, ge=1, description="completions per forward pass; bounds the (N, T, V) logits in memory"
    )
    checkpoint_every: Annotated[int, HOW_IT_RUNS] = Field(10, ge=1)
    seed: int = 0


class StudentTraining(Strict):
    """How each student is trained on the teacher's traces: a student's distillation stage is
    computed by these settings (its config and key), so adding a student or changing the RL
    twins' settings leaves the students already distilled in the cache."""

    method: Literal["sft", "on_policy"] = Field(
        "sft", description="on_policy: then minimise reverse KL to the teacher on own samples"
    )
    sft: TrainConfig = TrainConfig(epochs=2, learning_rate=1e-3)
    engine: EngineConfig = Field(
        EngineConfig(), description="where the students' SFT trains (the RL twins: rl_twin.engine)"
    )
    on_policy: OnPolicyDistillConfig = OnPolicyDistillConfig()

    @model_validator(mode="after")
    def _sft_batch_splits(self) -> StudentTraining:
        SFTConfig(train=self.sft, engine=self.engine)  # the students' SFT, checked at load
        return self


class DistillConfig(StudentTraining):
    """Stage 7: the final model's filtered traces, SFT into each student; RL-only twins."""

    traces: RejectionConfig = RejectionConfig(samples_per_prompt=2)
    students: list[StudentConfig] = Field(default_factory=list)
    rl_twin: GRPOConfig = GRPOConfig()
    rl_twins: bool = Field(True, description="train each student by GRPO alone for comparison")

    def student_training(self) -> StudentTraining:
        """This section's settings that a student's distillation is computed by."""
        names = StudentTraining.model_fields
        return StudentTraining(**{name: getattr(self, name) for name in names})


def _default_rewards(dotted: str) -> list[dict[str, Any]]:
    """A GRPO section's rewards when a profile does not list them: its default's."""
    node: Any = PipelineConfig()
    for key in dotted.split("."):
        node = getattr(node, key)
    return [term.model_dump(mode="json") for term in node.rewards]


def _scores_reasoning(term: RewardTerm) -> bool:
    return term.name == PREFERENCE and (term.kinds is None or "reasoning" in term.kinds)


class CacheConfig(Strict):
    """How a run takes stages from the cache (tasks/stage_cache.py); never part of a stage's key."""

    keep_finished: bool = Field(
        False,
        description="take each stage that finished before on the same inputs from the cache even "
        "where the project's code changed since: a fix to a later stage keeps the stages before "
        "it; the stages that never finished run under the code as it is now",
    )


class PipelineConfig(Strict):
    """A whole profile: what the flow takes as its parameter and what MLflow logs."""

    name: str = Field(
        "r1-tiny",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
        description="letters, digits, '.', '_' and '-': the MLflow experiment and registered "
        "model's name (MLflow refuses '/' and ':' in it)",
    )
    torch_threads: int | None = Field(
        None,
        ge=1,
        description="the most torch threads the run's process uses; it uses fewer where it may "
        "use fewer CPUs (its affinity, its cgroup's quota, OMP_NUM_THREADS). null: as many as "
        "those CPUs (host/threads.py)",
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="where the run's own process trains and samples: the single engine's "
        "training, the hf sampler (evaluation, rejection, traces, probes), GRPO in one process. "
        "DeepSpeed workers use their rank's GPU; the reward model and graders stay on the CPU",
    )
    data: DataConfig = DataConfig()
    bootstrap: BootstrapConfig = BootstrapConfig()
    curation: CurationConfig = CurationConfig()
    cold_start_sft: SFTConfig = SFTConfig()
    reasoning_rl: GRPOConfig = GRPOConfig(
        rewards=[
            *verifier_terms(),
            RewardTerm(name="format", weight=0.2),
            RewardTerm(name="language", weight=0.2),
        ]
    )
    r1_zero: GRPOConfig = GRPOConfig()
    r1_zero_in_pipeline: bool = Field(
        False,
        description="also run R1-Zero on the base inside the pipeline, for the comparison (the "
        "r1-zero flow runs it alone)",
    )
    reward_model: RewardModelConfig = RewardModelConfig()
    rejection: RejectionConfig = RejectionConfig()
    mixed_sft: SFTConfig = SFTConfig(train=TrainConfig(epochs=2, learning_rate=1e-3))
    all_scenarios_rl: GRPOConfig = GRPOConfig()
    distillation: DistillConfig = DistillConfig()
    evaluation: EvalConfig = EvalConfig()
    faults: FaultConfig = FaultConfig()
    cache: CacheConfig = CacheConfig()
    cluster: ClusterConfig = Field(
        ClusterConfig(), description="Ray and training nodes; never part of a stage's key"
    )

    @model_validator(mode="before")
    @classmethod
    def _plant_hacks(cls, data: Any) -> Any:
        """`faults.hacks`: the holed verifiers in every GRPO stage's rewards (configs/faults.py)."""
        if not isinstance(data, dict):
            return data
        return plant_hacks(data, _default_rewards)

    @model_validator(mode="after")
    def _solutions_exist(self) -> PipelineConfig:
        if self.curation.source == "solutions" and self.data.source != "files":
            raise ValueError(
                "curation.source 'solutions' needs data with reference solutions "
                "(data.source: files); the tiny world's problems have none"
            )
        return self

    @model_validator(mode="after")
    def _ranks_split_over_nodes(self) -> PipelineConfig:
        """Each node of a DeepSpeed stage runs the same number of ranks."""
        nodes = self.cluster.nodes
        uneven = [
            f"{stage} ({engine.processes} processes)"
            for stage, engine in self.engines().items()
            if engine.kind == "deepspeed" and engine.processes % nodes
        ]
        if uneven:
            raise ValueError(
                f"cluster.nodes is {nodes}, but {', '.join(uneven)} do not split evenly over "
                "the nodes: make engine.processes a multiple of cluster.nodes"
            )
        launched = [s for s, e in self.engines().items() if e.kind == "deepspeed"]
        by_deepspeed = [s for s in launched if self.engines()[s].launcher == "deepspeed"]
        if nodes > 1 and by_deepspeed:
            raise ValueError(
                f"cluster.nodes is {nodes}: ranks start on each node under torchrun's static "
                f"rendezvous, so set engine.launcher: torchrun for {', '.join(by_deepspeed)}"
            )
        return self

    @model_validator(mode="after")
    def _rollouts_placed(self) -> PipelineConfig:
        """Every GRPO stage can draw its rollouts where `cluster.rollouts` says."""
        for stage, config in self.grpo_stages().items():
            try:
                self.cluster.rollouts_for(config.max_staleness, config.engine.kind)
            except ValueError as error:
                raise ValueError(f"{stage}: {error}") from None
        return self

    def grpo_stages(self) -> dict[str, GRPOConfig]:
        return {
            "r1_zero": self.r1_zero,
            "reasoning_rl": self.reasoning_rl,
            "all_scenarios_rl": self.all_scenarios_rl,
            "distillation.rl_twin": self.distillation.rl_twin,
        }

    def engines(self) -> dict[str, EngineConfig]:
        """Every training stage's engine, by the config key that holds it."""
        return {
            "cold_start_sft": self.cold_start_sft.engine,
            "mixed_sft": self.mixed_sft.engine,
            "r1_zero": self.r1_zero.engine,
            "reasoning_rl": self.reasoning_rl.engine,
            "all_scenarios_rl": self.all_scenarios_rl.engine,
            "distillation": self.distillation.engine,
            "distillation.rl_twin": self.distillation.rl_twin.engine,
        }

    @model_validator(mode="after")
    def _reward_model_exists(self) -> PipelineConfig:
        """The preference reward scores with the reward model, which trains only on general data
        (a term for general prompts alone is idle without them)."""
        if self.data.general is not None:
            return self
        scored = {
            "r1_zero": self.r1_zero.rewards,
            "reasoning_rl": self.reasoning_rl.rewards,
            "rejection": self.rejection.rewards,
            "all_scenarios_rl": self.all_scenarios_rl.rewards,
            "distillation.traces": self.distillation.traces.rewards,
            "distillation.rl_twin": self.distillation.rl_twin.rewards,
        }
        using = [stage for stage, terms in scored.items() if any(map(_scores_reasoning, terms))]
        if using:
            raise ValueError(
                f"{', '.join(using)}: the 'preference' reward scores reasoning prompts with the "
                "reward model, but data.general is null, so none is trained: set data.general, "
                "or drop the term or give it kinds: [general]"
            )
        return self
