"""Sampling, evaluation, rewards, GRPO and the reward model."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from configs.guard import GuardConfig
from configs.strict import HOW_IT_RUNS, Family, Strict
from configs.supervised import EngineConfig, ModelConfig, TrainConfig
from contracts.reward_names import known_rewards


class SamplerConfig(Strict):
    """Which engine generates: `hf` (in-process, CPU or GPU) or `vllm` (GPU; the `gpu` extra).

    The other settings are vLLM's. Its engine calls run under time limits: a start, generate or
    weight sync that runs past its limit fails with SamplerTimeoutError, naming the key to raise,
    instead of hanging (sampling/watchdog.py).
    """

    backend: Literal["hf", "vllm"] = "hf"
    tensor_parallel_size: int = Field(
        1, ge=1, description="vllm: GPUs one engine shards the model over"
    )
    gpu_memory_utilization: Annotated[float, HOW_IT_RUNS] = Field(
        0.85,
        gt=0,
        le=1,
        description="vllm: share of each GPU's memory the engine takes (weights, KV cache)",
    )
    max_model_len: int | None = Field(
        None,
        ge=1,
        description="vllm: longest prompt + completion the engine holds; None: the stage's "
        "longest prompt + its max_new_tokens (not the model's whole context)",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="vllm: weights and activations; auto: the checkpoint's (fp32 -> bf16)"
    )
    start_timeout_s: Annotated[float, HOW_IT_RUNS] = Field(
        900.0, gt=0, description="vllm: engine start (loading, compiling, CUDA graphs, NCCL)"
    )
    generate_timeout_s: Annotated[float, HOW_IT_RUNS] = Field(
        1800.0, gt=0, description="vllm: one generate call (all its prompts and samples)"
    )
    sync_timeout_s: Annotated[float, HOW_IT_RUNS] = Field(
        300.0, gt=0, description="vllm: one weight sync from the trainer into the engine"
    )
    sync_chunk_mb: Annotated[int, HOW_IT_RUNS] = Field(
        256, ge=1, description="vllm: weights handed over per load call (bounds the extra memory)"
    )
    sleep_mode: Annotated[bool, HOW_IT_RUNS] = Field(
        True,
        description="vllm, a trainer's colocated engine: give its device memory back during "
        "each update (weights and KV cache discarded, reloaded by the next sync)",
    )


# A trainer's colocated engine shares the GPU with the policy, its gradients and AdamW state
# (16 bytes a parameter in fp32: 24 GiB for 1.5B), so it takes 0.3 of the memory (TRL's default
# for colocate mode) instead of the 0.85 an evaluation engine takes.
COLOCATED_GPU_MEMORY = 0.3


class EvalConfig(Strict):
    """Held-out evaluation: n samples per problem, pass@1 averaged over them, pass@k and cons@k."""

    max_problems: int | None = Field(100, ge=1)
    n_samples: int = Field(4, ge=1)
    k: int = Field(4, ge=1)
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_new_tokens: int = Field(160, ge=1)
    batch_size: int = Field(128, ge=1)
    sampler: SamplerConfig = SamplerConfig()
    general_prompts: int = Field(
        200, ge=0, description="held-out general prompts scored by the reward model; 0: none"
    )
    seed: int = 0

    @model_validator(mode="after")
    def _k_fits(self) -> EvalConfig:
        if self.k > self.n_samples:
            raise ValueError(f"k ({self.k}) exceeds n_samples ({self.n_samples})")
        return self


class RewardTerm(Strict):
    """One reward function by registry name, its weight, and parameters bound to it."""

    name: str
    weight: float = 1.0
    params: dict[str, bool | float | int | str] = Field(default_factory=dict)
    kinds: list[Literal["reasoning", "general"]] | None = Field(
        None, description="prompt kinds this reward scores; None: all (others get None)"
    )
    families: list[Family] | None = Field(
        None,
        description="reasoning families this reward scores (math, code, logic), and no general "
        "prompt; None: every family",
    )

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in known_rewards():
            raise ValueError(f"unknown reward {name!r}; known: {known_rewards()}")
        return name


class ProbeConfig(Strict):
    """Held-out pass@1 during RL (the paper's Figure 2, small): `problems` held-out problems,
    `samples` each, before training and every `every` steps (0: never)."""

    every: int = Field(0, ge=0)
    problems: int = Field(200, ge=1)
    samples: int = Field(1, ge=1)
    temperature: float = Field(0.6, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_new_tokens: int | None = Field(
        None, ge=1, description="None: the RL config's max_new_tokens"
    )
    on_workers: bool = Field(
        False,
        description="where the stage's rollouts come from sampling workers (a sampler process, "
        "Ray actors), they draw the probe too, a slice a step behind each step's draw, and the "
        "trainer reads it `every` steps after the version it measures (rl/probing.py); for "
        "workers with room to spare (a device of their own). false: the trainer's own sampler "
        "draws it after the step while training waits, as without workers; faster where the "
        "workers share the trainer's cores (docs/guard.md)",
    )


def verifier_terms() -> list[RewardTerm]:
    """Each family's correctness reward, limited to its family (problems.types.FAMILY_REWARDS)."""
    return [
        RewardTerm(name="accuracy", families=["math"]),
        RewardTerm(name="code", families=["code"]),
        RewardTerm(name="countdown", families=["logic"]),
    ]


class GRPOConfig(Strict):
    """Group Relative Policy Optimization (DeepSeekMath) and the knobs later work made standard."""

    steps: int = Field(40, ge=1)
    prompts_per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=2)
    max_new_tokens: int = Field(160, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    learning_rate: float = Field(5e-5, gt=0)
    max_grad_norm: float = Field(1.0, gt=0)
    inner_iterations: int = Field(1, ge=1, description="mu: policy updates per sampled batch")
    beta: float = Field(0.0, ge=0, description="KL weight; 0 loads no reference model")
    kl_estimator: Literal["k1", "k3"] = "k3"
    ref_refresh_every: int = Field(
        0, ge=0, description="copy the policy into the reference every N steps; 0: never"
    )
    eps_low: float = Field(0.2, ge=0, lt=1)
    eps_high: float = Field(0.2, ge=0, description="> eps_low is DAPO's clip-higher")
    aggregation: Literal["sequence_mean", "token_mean", "constant"] = "sequence_mean"
    supervision: Literal["outcome", "process"] = Field(
        "outcome",
        description="process: each checked reasoning step is rewarded too (DeepSeekMath 4.1.3)",
    )
    step_reward: float = Field(
        1.0, gt=0, description="process supervision: reward of a right, grounded step (else 0)"
    )
    scale_std: bool = Field(True, description="False: Dr. GRPO's centred-only advantages")
    dynamic_sampling: bool = Field(True, description="drop groups whose rewards are all equal")
    mask_truncated: bool = Field(True, description="no loss on completions cut at max_new_tokens")
    packing: bool = Field(
        True,
        description="the update's sequences laid end to end in one row, attention kept within "
        "each (training/varlen.py): the same log-probabilities with no padding",
    )
    importance_sampling_cap: float | None = Field(
        None,
        ge=1,
        description="truncated importance sampling: weigh each token's surrogate by "
        "min(pi_train / pi_sampler, cap), correcting for a sampler whose probabilities are not "
        "the trainer's (vLLM); None: off",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="asynchronous GRPO: step s samples from the policy after step s - k (k = "
        "this), on sampling workers that draw while the trainer updates; the loss corrects for "
        "the gap with importance_sampling_cap. 0: synchronous, every step from the current policy",
    )
    rewards: list[RewardTerm] = Field(
        default_factory=lambda: [*verifier_terms(), RewardTerm(name="format", weight=0.5)]
    )
    general_prompts: int = Field(
        0, ge=0, description="general prompts mixed into the reasoning ones (stage 6); 0: none"
    )
    general_per_step: int | None = Field(
        None,
        ge=1,
        description="general prompts in each step's batch (stage 6); none: drawn in proportion "
        "to their numbers",
    )
    max_seconds: float | None = Field(
        None, gt=0, description="stop after this much training time (RL-only twins in stage 7)"
    )
    checkpoint_every: int = Field(
        10,
        ge=1,
        description="save every N steps; also how far back the guard keeps and rolls back to, "
        "so, unlike SFT's, part of the stage's key",
    )
    samples_every: Annotated[int, HOW_IT_RUNS] = Field(
        10, ge=1, description="log a table of sample completions every N steps"
    )
    probe: ProbeConfig = ProbeConfig()
    guard: GuardConfig = Field(
        GuardConfig(),
        description="rules over the step metrics that catch reward hacking and collapse while "
        "the stage runs (docs/guard.md)",
    )
    engine: EngineConfig = Field(
        EngineConfig(),
        description="deepspeed: data-parallel ranks, each sampling and training on its share of "
        "a step's prompts",
    )
    sampler: SamplerConfig = Field(
        SamplerConfig(gpu_memory_utilization=COLOCATED_GPU_MEMORY),
        description="what generates the rollouts; vllm: a colocated engine, synced after each "
        "update, taking 0.3 of the GPU's memory by default so the trainer keeps the rest",
    )
    seed: int = 0

    @model_validator(mode="after")
    def _rewards_given(self) -> GRPOConfig:
        if not self.rewards:
            raise ValueError("at least one reward is needed")
        names = [r.name for r in self.rewards]
        if len(set(names)) != len(names):
            raise ValueError(f"a reward is listed twice: {names}")
        return self

    @model_validator(mode="after")
    def _staleness_corrected(self) -> GRPOConfig:
        if not self.max_staleness:
            return self
        if self.importance_sampling_cap is None:
            raise ValueError(
                f"max_staleness {self.max_staleness} samples from weights up to "
                f"{self.max_staleness} updates old: set importance_sampling_cap (e.g. 3.0, TRL's "
                "default) so that the loss corrects for the gap"
            )
        if self.engine.kind == "deepspeed":
            raise ValueError(
                "max_staleness: DeepSpeed ranks each sample their share with a colocated "
                "sampler, synchronously; asynchronous rollouts need engine.kind single"
            )
        return self

    @model_validator(mode="after")
    def _general_share_fits(self) -> GRPOConfig:
        if self.general_per_step is None:
            return self
        if not self.general_prompts:
            raise ValueError("general_per_step needs general_prompts to draw from")
        if self.general_per_step >= self.prompts_per_step:
            raise ValueError(
                f"general_per_step {self.general_per_step} leaves no reasoning prompt in a step "
                f"of {self.prompts_per_step}; make it smaller than prompts_per_step"
            )
        return self

    @model_validator(mode="after")
    def _prompts_split(self) -> GRPOConfig:
        engine = self.engine
        if engine.kind == "deepspeed" and self.prompts_per_step % engine.processes:
            raise ValueError(
                f"engine: prompts_per_step {self.prompts_per_step} does not split evenly over "
                f"{engine.processes} processes; make it a multiple of engine.processes"
            )
        if engine.kind == "deepspeed" and self.probe.every and engine.processes > 1:
            raise ValueError(
                f"probe: held-out probing runs in one process (engine.kind single, or deepspeed "
                f"with processes 1), not over {engine.processes}: set probe.every 0"
            )
        rolling = [n for n, r in self.guard.rules().items() if r.action == "rollback"]
        if engine.kind == "deepspeed" and self.guard.enabled and rolling:
            raise ValueError(
                f"guard: {', '.join(rolling)}: rollback runs with engine.kind single only "
                "(a DeepSpeed stage keeps one committed checkpoint); say stop or warn"
            )
        if engine.kind == "deepspeed" and self.sampler.tensor_parallel_size > 1:
            raise ValueError(
                "sampler.tensor_parallel_size: each DeepSpeed rank runs its own vLLM engine on "
                "its share of the prompts, so it must be 1"
            )
        return self


class RewardModelConfig(Strict):
    """Stage 6's reward model: where it starts and how it is trained on preference pairs."""

    init: Literal["base", "fresh"] = Field(
        "base", description="base: the causal LM's body and a new scalar head; fresh: `model`"
    )
    model: ModelConfig = ModelConfig(
        hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=192
    )
    train: TrainConfig = TrainConfig(
        epochs=1,
        batch_size=16,
        learning_rate=3e-4,
        warmup_steps=5,
        weight_decay=0.0,
        max_length=384,
        checkpoint_every=100,
        log_every=10,
    )
    eval_batch_size: Annotated[int, HOW_IT_RUNS] = Field(64, ge=1)
    seed: int = Field(0, description="the new head's (or fresh model's) init; train.seed orders")
