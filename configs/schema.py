"""One validated config object per stage; together they make a pipeline profile.

Unknown keys are refused (a typo must not silently fall back to a default) and models are frozen
so the object that MLflow logs is the object that ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Family = Literal["math", "code", "logic"]


class MathWorld(Strict):
    """Arithmetic chains: a start value and `min_steps` to `max_steps` operations."""

    n_train: int = Field(2000, ge=0)
    n_heldout: int = Field(200, ge=0)
    min_steps: int = Field(1, ge=1)
    max_steps: int = Field(3, ge=1)
    max_operand: int = Field(9, ge=2)

    @model_validator(mode="after")
    def _steps_ordered(self) -> MathWorld:
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps ({self.min_steps}) exceeds max_steps ({self.max_steps})")
        return self


class CodeWorld(Strict):
    """Functions to write from a description: a chain of `min_ops` to `max_ops` operations on
    the argument, judged by `tests` hidden assert-style tests."""

    n_train: int = Field(600, ge=0)
    n_heldout: int = Field(300, ge=0)
    min_ops: int = Field(1, ge=1)
    max_ops: int = Field(3, ge=1)
    max_constant: int = Field(9, ge=1)
    tests: int = Field(3, ge=1, le=10)

    @model_validator(mode="after")
    def _ops_ordered(self) -> CodeWorld:
        if self.min_ops > self.max_ops:
            raise ValueError(f"min_ops ({self.min_ops}) exceeds max_ops ({self.max_ops})")
        return self


class LogicWorld(Strict):
    """Puzzles: reach a target from three numbers with + - * /, each number used once."""

    n_train: int = Field(600, ge=0)
    n_heldout: int = Field(300, ge=0)
    min_number: int = Field(1, ge=1)
    max_number: int = Field(9, ge=2)
    max_target: int = Field(100, ge=1)

    @model_validator(mode="after")
    def _numbers_ordered(self) -> LogicWorld:
        if self.min_number > self.max_number:
            raise ValueError(
                f"min_number ({self.min_number}) exceeds max_number ({self.max_number})"
            )
        return self


class WorldConfig(Strict):
    """The tiny world's generated problems, one section per family (null: no such problems)."""

    seed: int = 0
    second_script_share: float = Field(0.3, ge=0.0, le=1.0)
    math: MathWorld | None = MathWorld()
    code: CodeWorld | None = None
    logic: LogicWorld | None = None

    @model_validator(mode="after")
    def _some_problems(self) -> WorldConfig:
        families = [f for f in (self.math, self.code, self.logic) if f is not None]
        if not any(f.n_train for f in families) or not any(f.n_heldout for f in families):
            raise ValueError("the world needs training and held-out problems of some family")
        return self


GENERAL_KINDS = (
    "capitals",
    "reverse",
    "colour",
    "category",
    "repeat",
    "sort",
    "greeting",
    "one_word",
)
GENERAL_REJECTIONS = ("wrong", "verbose", "script", "no_tags", "repetition")


class GeneralConfig(Strict):
    """The general task sets: mixed-SFT rows, preference pairs, RL and evaluation prompts."""

    seed: int = 0
    n_sft: int = Field(600, ge=0)
    n_pairs_train: int = Field(2000, ge=1)
    n_pairs_heldout: int = Field(400, ge=1)
    n_eval_prompts: int = Field(100, ge=1)
    n_rl_prompts: int = Field(200, ge=0)
    second_script_share: float = Field(0.3, ge=0.0, le=1.0)
    heldout_share: float = Field(0.2, gt=0.0, lt=1.0, description="share of task keys held out")
    kinds: tuple[str, ...] = GENERAL_KINDS
    rejections: tuple[str, ...] = GENERAL_REJECTIONS

    @field_validator("kinds", "rejections")
    @classmethod
    def _known(cls, values: tuple[str, ...], info) -> tuple[str, ...]:
        known = GENERAL_KINDS if info.field_name == "kinds" else GENERAL_REJECTIONS
        unknown = sorted(set(values) - set(known))
        if unknown or not values:
            raise ValueError(f"unknown or no {info.field_name}: {unknown}; known: {list(known)}")
        return values


class FilesConfig(Strict):
    """Real problems: JSONL or Parquet with question and answer columns."""

    train_path: Path
    heldout_path: Path
    question_field: str = "question"
    answer_field: str = "answer"
    bad_rows: Literal["skip", "refuse"] = Field(
        "skip",
        description="malformed rows (missing or empty question or answer, wrong types, invalid "
        "UTF-8, over max_row_chars): skip and count them, or refuse the file naming the line",
    )
    max_row_chars: int = Field(20_000, ge=1, description="a longer row is malformed")


class DataConfig(Strict):
    source: Literal["tiny", "files"] = "tiny"
    world: WorldConfig = WorldConfig()
    files: FilesConfig | None = None
    general: GeneralConfig | None = Field(
        GeneralConfig(), description="non-reasoning tasks and preference pairs; None: none"
    )

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
    length_window: int = Field(
        0,
        ge=0,
        description="batches per stretch sorted by length (0 or 1: plain random batches); for "
        "data of one kind: on a mixture, like lengths put like kinds together (README)",
    )
    packing: bool = Field(
        True,
        description="lay each batch's examples end to end in one row, attention kept within "
        "each example (training/varlen.py): the same loss with no padding",
    )
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
    check_docs: int = Field(
        0,
        ge=0,
        description="comparison drills (`21 vs 90: no.`), the equality a base model "
        "knows, for the logic family's checks of an attempt against its target",
    )

    @model_validator(mode="after")
    def _shares_sum(self) -> CorpusConfig:
        total = self.direct_share + self.steps_share + self.mixed_share + self.formatted_share
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"style shares sum to {total:.3f}, not 1")
        return self


def _hub_id() -> Any:
    """The `hub_id` field of a checkpoint: where a user with hub access downloads `path`."""
    return Field(
        None,
        description="the hub repository `path` is a download of (e.g. Qwen/Qwen2.5-1.5B-Instruct):"
        " named in messages and records, never fetched",
    )


class BootstrapConfig(Strict):
    """Stage 0: the policy's base. The tiny world trains a tokenizer and a base model from
    scratch (`vocab_size`, `model`, `corpus`, `train`); with `path`, a local pretrained
    checkpoint is the base and nothing trains."""

    path: Path | None = Field(
        None, description="a local folder saved with save_pretrained (weights, config, tokenizer)"
    )
    hub_id: str | None = _hub_id()
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

    source: Literal["teacher", "solutions"] = Field(
        "teacher",
        description="teacher: the programmatic teacher (needs worked steps: the tiny world); "
        "solutions: the data set's own reference solutions (GSM8K, MATH) as the reasoning",
    )
    max_problems: int | None = Field(None, ge=1)
    teacher: TeacherConfig = TeacherConfig()
    filters: FilterConfig = FilterConfig()


class EngineConfig(Strict):
    """Where a training stage runs: this process (`single`), or DeepSpeed ZeRO data parallelism
    over `processes` worker processes that the stage launches (`deepspeed`; the `dev` or `gpu`
    extra installs it)."""

    kind: Literal["single", "deepspeed"] = "single"
    processes: int = Field(2, ge=1, description="deepspeed: worker processes (one per GPU)")
    zero_stage: Literal[2, 3] = Field(
        2, description="2: optimizer state and gradients sharded; 3: the parameters too"
    )
    bucket_size: float = Field(
        5e6,
        ge=1e3,
        description="elements per ZeRO reduce/all-gather bucket; DeepSpeed's 5e8 default makes "
        "each step of a small model slow on CPU",
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="bf16: DeepSpeed's bf16 mixed precision (bf16 weights and activations, fp32 "
        "master weights in the optimizer), for GPUs; fp32: what the CPU tests compare",
    )
    launcher: Literal["torchrun", "deepspeed"] = "torchrun"
    master_port: int | None = Field(
        None, ge=1024, le=65535, description="rendezvous port; None: a free one"
    )
    timeout_s: float = Field(
        24 * 3600.0, gt=0, description="the workers are stopped and the stage fails after this"
    )


class SFTConfig(Strict):
    """Stage 2: supervised fine-tuning, loss on the completion only."""

    train: TrainConfig = TrainConfig(epochs=2, learning_rate=5e-4)
    engine: EngineConfig = EngineConfig()

    @model_validator(mode="after")
    def _batch_splits(self) -> SFTConfig:
        engine = self.engine
        if engine.kind == "deepspeed" and self.train.batch_size % engine.processes:
            raise ValueError(
                f"engine: train.batch_size {self.train.batch_size} does not split evenly over "
                f"{engine.processes} processes; make the batch size a multiple of "
                "engine.processes"
            )
        return self


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
    gpu_memory_utilization: float = Field(
        0.85,
        gt=0,
        le=1,
        description="vllm: share of each GPU's memory the engine takes (weights, KV cache)",
    )
    max_model_len: int | None = Field(
        None, ge=1, description="vllm: longest prompt + completion; None: the model's own"
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="vllm: weights and activations; auto: the checkpoint's (fp32 -> bf16)"
    )
    start_timeout_s: float = Field(
        900.0, gt=0, description="vllm: engine start (loading, compiling, CUDA graphs, NCCL)"
    )
    generate_timeout_s: float = Field(
        1800.0, gt=0, description="vllm: one generate call (all its prompts and samples)"
    )
    sync_timeout_s: float = Field(
        300.0, gt=0, description="vllm: one weight sync from the trainer into the engine"
    )
    sync_chunk_mb: int = Field(
        256, ge=1, description="vllm: weights handed over per load call (bounds the extra memory)"
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
        from rewards.registry import known_rewards  # here: configs stays a leaf at import time

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
    checkpoint_every: int = Field(10, ge=1)
    samples_every: int = Field(
        10, ge=1, description="log a table of sample completions every N steps"
    )
    probe: ProbeConfig = ProbeConfig()
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
        if engine.kind == "deepspeed" and self.probe.every:
            raise ValueError("probe: held-out probing runs with engine.kind single only")
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
    eval_batch_size: int = Field(64, ge=1)
    seed: int = Field(0, description="the new head's (or fresh model's) init; train.seed orders")


class FunnelConfig(Strict):
    """Stage 4's SQL filters over the stored rollouts (storage.rollouts), in this order.

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
    batch_size: int = Field(128, ge=1)
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

    name: str
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
    hub_id: str | None = _hub_id()

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
    micro_batch_size: int = Field(
        16, ge=1, description="completions per forward pass; bounds the (N, T, V) logits in memory"
    )
    checkpoint_every: int = Field(10, ge=1)
    seed: int = 0


class DistillConfig(Strict):
    """Stage 7: the final model's filtered traces, SFT into each student; RL-only twins."""

    traces: RejectionConfig = RejectionConfig(samples_per_prompt=2)
    students: list[StudentConfig] = Field(default_factory=list)
    method: Literal["sft", "on_policy"] = Field(
        "sft", description="on_policy: then minimise reverse KL to the teacher on own samples"
    )
    sft: TrainConfig = TrainConfig(epochs=2, learning_rate=1e-3)
    engine: EngineConfig = Field(
        EngineConfig(), description="where the students' SFT trains (the RL twins: rl_twin.engine)"
    )
    on_policy: OnPolicyDistillConfig = OnPolicyDistillConfig()
    rl_twin: GRPOConfig = GRPOConfig()
    rl_twins: bool = Field(True, description="train each student by GRPO alone for comparison")

    @model_validator(mode="after")
    def _sft_batch_splits(self) -> DistillConfig:
        SFTConfig(train=self.sft, engine=self.engine)  # the students' SFT, checked at load
        return self


def _scores_reasoning(term: RewardTerm) -> bool:
    return term.name == "preference" and (term.kinds is None or "reasoning" in term.kinds)


class FaultConfig(Strict):
    """Deliberate faults, to see the pipeline recover from them."""

    # "stage" or "stage@step": that stage raises once per flow run, at its start or once its
    # training has logged the step; a retry of the flow run then resumes past it
    fail_once_at: str | None = Field(None, pattern=r"^[a-z0-9_]+(@[0-9]+)?$")


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

    @model_validator(mode="after")
    def _solutions_exist(self) -> PipelineConfig:
        if self.curation.source == "solutions" and self.data.source != "files":
            raise ValueError(
                "curation.source 'solutions' needs data with reference solutions "
                "(data.source: files); the tiny world's problems have none"
            )
        return self

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
