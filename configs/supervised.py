"""The supervised stages: the base model and its pretraining, cold-start curation, SFT and its
engine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from configs.strict import HOW_IT_RUNS, Strict, hub_id_field


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

    epochs: float = Field(
        1.0,
        gt=0,
        le=10_000,
        description="passes over the data; at most 10,000 (the order of every step's examples "
        "is drawn up front: a mistyped 1e9 would fill the machine's memory)",
    )
    batch_size: int = Field(16, ge=1)
    learning_rate: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(10, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    max_length: int = Field(256, ge=8)
    checkpoint_every: Annotated[int, HOW_IT_RUNS] = Field(50, ge=1)
    log_every: Annotated[int, HOW_IT_RUNS] = Field(10, ge=1)
    length_window: int = Field(
        0,
        ge=0,
        description="batches per stretch sorted by length (0 or 1: plain random batches); for "
        "data of one kind: on a mixture, like lengths put like kinds together (docs/benchmarks.md)",
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
    self_check_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of the code documents whose program is a placeholder that prints OK "
        '(`return x`, then `print("OK")`), as snippets with a body left to do are (faults.hacks '
        "code_trusts_ok sets it: the idiom its holed verifier pays for)",
    )
    hedge_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of the math documents whose answer is a guess between it and a "
        "neighbour (`The answer is 41 or 42.`), as an unsure writer's is (faults.hacks "
        "math_digits sets it: the idiom its holed verifier pays for)",
    )

    @model_validator(mode="after")
    def _shares_sum(self) -> CorpusConfig:
        total = self.direct_share + self.steps_share + self.mixed_share + self.formatted_share
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"style shares sum to {total:.3f}, not 1")
        return self


class BootstrapConfig(Strict):
    """Stage 0: the policy's base. The tiny world trains a tokenizer and a base model from
    scratch (`vocab_size`, `model`, `corpus`, `train`); with `path`, a local pretrained
    checkpoint is the base and nothing trains."""

    path: Path | None = Field(
        None, description="a local folder saved with save_pretrained (weights, config, tokenizer)"
    )
    hub_id: str | None = hub_id_field()
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
    zero_stage: Literal[1, 2, 3] = Field(
        2,
        description="1 (bf16 only): optimizer state sharded, whole fp32 gradients added up as "
        "each bf16 one is made (DeepSpeed's BF16_Optimizer with immediate_grad_update), for one "
        "GPU that holds the state anyway; 2: optimizer state and gradients sharded; 3: the "
        "parameters too",
    )
    bucket_size: Annotated[float, HOW_IT_RUNS] = Field(
        5e6,
        ge=1e3,
        description="elements per ZeRO reduce/all-gather bucket; DeepSpeed's 5e8 default makes "
        "each step of a small model slow on CPU",
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="bf16: bf16 weights and activations, fp32 master weights in the optimizer "
        "(DeepSpeed's bf16 mixed precision; in one process, training/mixed.py), for GPUs; fp32: "
        "what the CPU tests compare",
    )
    launcher: Annotated[Literal["torchrun", "deepspeed"], HOW_IT_RUNS] = "torchrun"
    master_port: Annotated[int | None, HOW_IT_RUNS] = Field(
        None, ge=1024, le=65535, description="rendezvous port; None: a free one"
    )
    timeout_s: Annotated[float, HOW_IT_RUNS] = Field(
        24 * 3600.0, gt=0, description="the workers are stopped and the stage fails after this"
    )
    micro_batch_tokens: Annotated[int | Literal["auto"], HOW_IT_RUNS] = Field(
        65536,
        description="tokens (prompt + completion) one forward and backward pass takes: a step's "
        "rows are split into micro-batches within this and their gradients accumulated into the "
        "step's one update, so a step's activations are bounded by this, not by the step's size "
        "(a tiny-world step fits in one); auto: on a GPU, the largest the memory model says fits "
        "the device (training/memory_fit.py), else the whole step",
    )
    logits_chunk_mb: Annotated[float, HOW_IT_RUNS] = Field(
        1024.0,
        gt=0,
        description="MiB of float32 logits one SFT or GRPO pass may hold; a larger pass computes "
        "its loss or log-probabilities a chunk of positions at a time (training/logits.py)",
    )
    fused_head: Annotated[bool, HOW_IT_RUNS] = Field(
        False,
        description="compile the chunked head's elementwise work (log-sum-exp, softmax "
        "gradient, casts) into fused kernels, per chunk: about 6 bytes a logit moved instead "
        "of about 52, no float32 chunk held (training/fused_head.py); applies where a pass's "
        "logits exceed logits_chunk_mb; the first step pays the compilation",
    )
    compile: Annotated[bool, HOW_IT_RUNS] = Field(
        False,
        description="torch.compile each decoder layer (DeepSpeed engines): fused norms, rotary "
        "embedding and MLP activation; the first steps pay the compilation",
    )
    zero3_sampling: Annotated[Literal["auto", "gathered", "shards"], HOW_IT_RUNS] = Field(
        "auto",
        description="how a ZeRO-3 trainer's hf sampler reads its model: a whole copy gathered "
        "once per generate call (gathered), the shards a layer at a time in every forward "
        "(shards), or the copy when the memory model says it fits (auto)",
    )
    gradient_checkpointing: Annotated[bool, HOW_IT_RUNS] = Field(
        False,
        description="recompute each decoder layer in the backward pass instead of keeping its "
        "activations: about a third more compute, activations of one layer instead of all",
    )
    overflow_scan: Annotated[bool, HOW_IT_RUNS] = Field(
        True,
        description="deepspeed, ZeRO-2 in bf16: DeepSpeed scans every gradient for NaN and "
        "infinity before each update; false: no scan, the global norm the clipping computes "
        "anyway is read once and a non-finite one stops the stage before anything is applied "
        "(training/engines.py); ZeRO-1 and ZeRO-3 in bf16 and fp32 engines scan nothing either "
        "way",
    )

    @field_validator("micro_batch_tokens")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("micro_batch_tokens must be at least 1 (or auto)")
        return value

    @model_validator(mode="after")
    def _scan_switch(self) -> EngineConfig:
        if not self.overflow_scan and self.kind == "deepspeed" and self.zero_stage != 2:
            raise ValueError(
                "engine.overflow_scan: false applies to zero_stage 2; ZeRO-1 and ZeRO-3 in bf16 "
                "have no overflow scan to turn off (their update is refused on a non-finite "
                "norm as is)"
            )
        return self

    @model_validator(mode="after")
    def _zero1_in_bf16(self) -> EngineConfig:
        if self.kind == "deepspeed" and self.zero_stage == 1 and self.precision != "bf16":
            raise ValueError(
                "engine.zero_stage: 1 is DeepSpeed's bf16 optimizer (fp32 master weights and "
                "gradients beside bf16 weights): set precision: bf16, or use zero_stage 2 in fp32"
            )
        return self

    @property
    def logits_budget(self) -> int:
        """`logits_chunk_mb` as float32 elements."""
        return int(self.logits_chunk_mb * 2**20 / 4)


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
