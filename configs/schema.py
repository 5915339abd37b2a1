"""One validated config object per stage; together they make a pipeline profile.

Unknown keys are refused (a typo must not silently fall back to a default) and models are frozen
so the object that MLflow logs is the object that ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorldConfig(Strict):
    """The tiny world's generated problems."""

    seed: int = 0
    n_train: int = Field(2000, ge=1)
    n_heldout: int = Field(200, ge=1)
    min_steps: int = Field(1, ge=1)
    max_steps: int = Field(3, ge=1)
    max_operand: int = Field(9, ge=2)
    second_script_share: float = Field(0.3, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _steps_ordered(self) -> WorldConfig:
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps ({self.min_steps}) exceeds max_steps ({self.max_steps})")
        return self


class FilesConfig(Strict):
    """Real problems: JSONL or Parquet with question and answer columns."""

    train_path: Path
    heldout_path: Path
    question_field: str = "question"
    answer_field: str = "answer"


class DataConfig(Strict):
    source: Literal["tiny", "files"] = "tiny"
    world: WorldConfig = WorldConfig()
    files: FilesConfig | None = None

    @model_validator(mode="after")
    def _files_given(self) -> DataConfig:
        if self.source == "files" and self.files is None:
            raise ValueError(
                "source 'files' needs a 'files' section with train_path and heldout_path"
            )
        return self


class ModelConfig(Strict):
    """A small decoder built from a transformers config."""

    architecture: Literal["qwen2", "llama"] = "qwen2"
    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(384, ge=8)
    max_position_embeddings: int = Field(512, ge=16)

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}"
            )
        return self


class TrainConfig(Strict):
    """A causal-LM training run on one process."""

    epochs: float = Field(1.0, gt=0)
    batch_size: int = Field(16, ge=1)
    learning_rate: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(10, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    max_length: int = Field(256, ge=8)
    checkpoint_every: int = Field(50, ge=1)
    log_every: int = Field(10, ge=1)
    seed: int = 0


class CorpusConfig(Strict):
    """Styles of the synthetic pretraining documents; shares of the answer styles sum to 1."""

    docs_per_problem: int = Field(2, ge=1)
    direct_share: float = Field(0.35, ge=0, le=1)
    steps_share: float = Field(0.45, ge=0, le=1)
    mixed_share: float = Field(0.17, ge=0, le=1)
    formatted_share: float = Field(0.03, ge=0, le=1)
    wrong_answer_share: float = Field(0.15, ge=0, le=1)
    fact_docs: int = Field(
        0, ge=0, description="arithmetic drill documents (lists of equations), as web text has"
    )
    facts_per_doc: int = Field(8, ge=1)

    @model_validator(mode="after")
    def _shares_sum(self) -> CorpusConfig:
        total = self.direct_share + self.steps_share + self.mixed_share + self.formatted_share
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"style shares sum to {total:.3f}, not 1")
        return self


class BootstrapConfig(Strict):
    """Stage 0: tokenizer and base model for the tiny world."""

    vocab_size: int = Field(1024, ge=64)
    model: ModelConfig = ModelConfig()
    corpus: CorpusConfig = CorpusConfig()
    train: TrainConfig = TrainConfig()


class TeacherConfig(Strict):
    """The programmatic long-CoT teacher and the faults it makes, so the filters have work."""

    traces_per_problem: int = Field(1, ge=1)
    slip_share: float = Field(0.1, ge=0, le=1)
    drop_tags_share: float = Field(0.05, ge=0, le=1)
    mix_language_share: float = Field(0.08, ge=0, le=1)
    ramble_share: float = Field(0.05, ge=0, le=1)
    repeat_share: float = Field(0.05, ge=0, le=1)
    no_summary_share: float = Field(0.05, ge=0, le=1)
    duplicate_share: float = Field(0.05, ge=0, le=1)
    seed: int = 0

    @classmethod
    def faultless(cls, seed: int = 0) -> TeacherConfig:
        """A teacher that makes no deliberate faults: every trace is clean."""
        shares = [name for name in cls.model_fields if name.endswith("_share")]
        return cls(seed=seed, **dict.fromkeys(shares, 0.0))


class FilterConfig(Strict):
    min_tokens: int = Field(16, ge=1)
    max_tokens: int = Field(200, ge=1)
    min_language_share: float = Field(0.95, ge=0, le=1)
    min_distinct_trigrams: float = Field(0.75, ge=0, le=1)
    min_summary_words: int = Field(3, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> FilterConfig:
        if self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) exceeds max_tokens ({self.max_tokens})"
            )
        return self


class CurationConfig(Strict):
    """Stage 1: cold-start long-CoT data."""

    max_problems: int | None = Field(None, ge=1)
    teacher: TeacherConfig = TeacherConfig()
    filters: FilterConfig = FilterConfig()


class SFTConfig(Strict):
    """Stage 2: supervised fine-tuning, loss on the completion only."""

    train: TrainConfig = TrainConfig(epochs=2, learning_rate=5e-4)


class EvalConfig(Strict):
    """Held-out evaluation: n samples per problem, pass@1 averaged over them, pass@k and cons@k."""

    max_problems: int | None = Field(100, ge=1)
    n_samples: int = Field(4, ge=1)
    k: int = Field(4, ge=1)
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_new_tokens: int = Field(160, ge=1)
    batch_size: int = Field(128, ge=1)
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
    params: dict[str, float | int | str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        from rewards.registry import REWARDS  # imported here: configs stays a leaf at import time

        if name not in REWARDS:
            raise ValueError(f"unknown reward {name!r}; known: {sorted(REWARDS)}")
        return name


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
    rewards: list[RewardTerm] = Field(
        default_factory=lambda: [RewardTerm(name="accuracy"), RewardTerm(name="format", weight=0.5)]
    )
    checkpoint_every: int = Field(10, ge=1)
    samples_every: int = Field(
        10, ge=1, description="log a table of sample completions every N steps"
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


class PipelineConfig(Strict):
    """A whole profile: what the flow takes as its parameter and what MLflow logs."""

    name: str = "r1-tiny"
    torch_threads: int | None = Field(None, ge=1)
    data: DataConfig = DataConfig()
    bootstrap: BootstrapConfig = BootstrapConfig()
    curation: CurationConfig = CurationConfig()
    cold_start_sft: SFTConfig = SFTConfig()
    reasoning_rl: GRPOConfig = GRPOConfig(
        rewards=[
            RewardTerm(name="accuracy"),
            RewardTerm(name="format", weight=0.2),
            RewardTerm(name="language", weight=0.2),
        ]
    )
    r1_zero: GRPOConfig = GRPOConfig()
    evaluation: EvalConfig = EvalConfig()
