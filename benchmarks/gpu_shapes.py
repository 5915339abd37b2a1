"""The GPU check's model shapes and SFT cases (benchmarks/gpu_check.py), and the rows both sides
of its SFT comparison train on: our SFT step (packed rows) and the peer (benchmarks/gpu_peers.py,
padded rows) take the same examples in the same batches, so their token and FLOP counts are
comparable position for position.

A case is `ROWSxTOKENS` (every row `TOKENS` long, the first 64 positions a prompt that carries no
loss) or `varMAX[@TOKENS]`: rows of lengths drawn between MAX x 100/512 and MAX (see
`trace_lengths`), as many rows a step as make about `TOKENS` tokens (by default as many as the
shape's first fixed case holds).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

import torch

from benchmarks.throughput import loss_training_flops, training_flops
from configs.supervised import ModelConfig, TrainConfig
from training.batches import batch_order
from training.examples import IGNORE, Example

SHAPES: dict[str, tuple[ModelConfig, int]] = {
    "qwen2.5-0.5b": (  # the profile's students' shape: 494M parameters, the tied head 136M
        ModelConfig(
            architecture="qwen2", hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
            intermediate_size=4864, max_position_embeddings=32768,
        ),
        151936,
    ),
    "qwen2.5-1.5b": (  # the profile's policy: 1,544M parameters, head size 128, the tied head 233M
        ModelConfig(
            architecture="qwen2", hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
            intermediate_size=8960, max_position_embeddings=32768,
        ),
        151936,
    ),
    "tiny": (
        ModelConfig(
            hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128
        ),
        4096,
    ),
    "tiny-deeper": (  # a second tiny shape: a run of several shapes, checked on CPU
        ModelConfig(
            hidden_size=96, num_layers=3, num_heads=6, num_kv_heads=2, intermediate_size=192
        ),
        4096,
    ),
}  # fmt: skip

# Each shape's SFT cases when `--sft-shapes` is not given: 1.5B at 16 x 512, where the peer's
# whole-batch float32 logits (and their gradient) still fit an 80 GB card.
DEFAULT_CASES: dict[str, tuple[str, ...]] = {
    "qwen2.5-0.5b": ("32x512", "var512"),
    "qwen2.5-1.5b": ("16x512", "var512"),
    "tiny": ("4x96", "var96"),
    "tiny-deeper": ("4x96", "var96"),
}

FIXED_PROMPT = 64  # unlabelled positions at the start of a fixed case's row
LONGEST = 512  # the trace lengths below are drawn for rows of at most this many tokens
SHORTEST = 100
MEDIAN = 220
SIGMA = 0.35
PROMPTS = (48, 96)  # a GSM8K question in the chat template, tokens


@dataclass(frozen=True)
class SFTCase:
    """`rows` rows a step; every row `length` tokens, or (variable) up to `length`."""

    rows: int
    length: int
    variable: bool = False
    tokens: int = 0  # a step's tokens: rows x length, or (variable) what the rows were sized to

    @property
    def name(self) -> str:
        return f"var{self.length}" if self.variable else f"{self.rows}x{self.length}"


def parse_case(text: str, fixed_tokens: int | None) -> SFTCase:
    """`ROWSxTOKENS` or `varMAX[@TOKENS]`; a variable case without `@TOKENS` takes
    `fixed_tokens` tokens a step (or 32 rows' worth of MAX)."""
    fixed = re.fullmatch(r"(\d+)x(\d+)", text)
    if fixed:
        rows, length = int(fixed[1]), int(fixed[2])
        return SFTCase(rows, length, tokens=rows * length)
    variable = re.fullmatch(r"var(\d+)(?:@(\d+))?", text)
    if not variable:
        raise ValueError(f"an SFT case is ROWSxTOKENS or varMAX[@TOKENS], not {text!r}")
    longest = int(variable[1])
    tokens = int(variable[2]) if variable[2] else fixed_tokens or 32 * longest
    rows = max(1, round(tokens / _mean_length(longest)))
    return SFTCase(rows, longest, variable=True, tokens=tokens)


def shape_cases(shape: str, texts: list[str] | None) -> list[SFTCase]:
    """The cases a shape runs: `texts` (from `--sft-shapes`) or the shape's defaults."""
    texts = texts or list(DEFAULT_CASES.get(shape, ("32x512", "var512")))
    fixed = [parse_case(t, None) for t in texts if not t.startswith("var")]
    tokens = fixed[0].tokens if fixed else None
    return [parse_case(t, tokens) for t in texts]


def peer_budget(cases: list[SFTCase]) -> int:
    """The most positions the peer pads in one pass: the first fixed case's (which it runs
    whole), else the largest case's tokens; longer padded batches accumulate micro-batches."""
    fixed = [c.tokens for c in cases if not c.variable]
    return fixed[0] if fixed else max(c.tokens for c in cases)


def trace_lengths(count: int, longest: int, seed: int) -> list[int]:
    """`count` row lengths like GSM8K's worked-solution traces, scaled to rows of at most
    `longest` tokens. At 512: a log-normal of median 220 and sigma 0.35 redrawn outside
    100-512 (question, template and solution: a mean of 232, two thirds of the rows in
    150-300, one in ten above 345, one in five hundred above 500)."""
    rng = random.Random(seed)
    scale = longest / LONGEST
    low, mu = SHORTEST * scale, math.log(MEDIAN * scale)
    lengths = []
    while len(lengths) < count:
        x = rng.lognormvariate(mu, SIGMA)
        if low <= x <= longest:
            lengths.append(max(2, round(x)))
    return lengths


def _mean_length(longest: int) -> float:
    """The mean of the drawn lengths, from a seeded pool of 10,000."""
    pool = trace_lengths(10_000, longest, seed=1)
    return sum(pool) / len(pool)


def _prompt_length(length: int, longest: int, rng: random.Random) -> int:
    """A variable row's unlabelled prompt: 48-96 tokens at 512 (scaled), at most half the row."""
    scale = longest / LONGEST
    drawn = rng.randint(round(PROMPTS[0] * scale), round(PROMPTS[1] * scale))
    return max(1, min(drawn, length // 2))


def case_examples(case: SFTCase, vocab: int, steps: int, seed: int = 0) -> list[Example]:
    """Random-token rows for `steps` steps of `case`, each with a prompt that carries no loss."""
    count = case.rows * steps
    generator = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    if case.variable:
        lengths = trace_lengths(count, case.length, seed)
        prompts = [_prompt_length(n, case.length, rng) for n in lengths]
    else:
        lengths = [case.length] * count
        prompts = [min(FIXED_PROMPT, case.length - 1)] * count
    examples = []
    for length, prompt in zip(lengths, prompts, strict=True):
        ids = torch.randint(8, vocab, (length,), generator=generator).tolist()
        examples.append(Example(ids, [IGNORE] * prompt + ids[prompt:]))
    return examples


def sft_config(rows: int) -> TrainConfig:
    """The training settings of the check's SFT steps (ours and the peer's batches)."""
    return TrainConfig(batch_size=rows, epochs=1, warmup_steps=0, learning_rate=1e-5)


def step_batches(examples: list[Example], rows: int) -> list[list[Example]]:
    """Each step's examples in the order SFTStepper takes them under `sft_config(rows)`."""
    cfg = sft_config(rows)
    order = batch_order(len(examples), cfg, [len(e.input_ids) for e in examples])
    return [[examples[i] for i in batch] for batch in order]


def loss_positions(example: Example) -> int:
    """Positions whose next-token loss counts: a labelled token predicted from the one before
    it (the first position predicts nothing)."""
    return sum(label != IGNORE for label in example.labels[1:])


@dataclass(frozen=True)
class Count:
    """What steps of SFT trained: content positions (no padding), positions that carry loss, and
    the FLOPs of each convention (benchmarks/throughput.py)."""

    tokens: int
    loss_tokens: int
    flops: float  # 6N at every content position, attention on top
    loss_flops: float  # the LM head only where a position carries loss


def count_batches(batches: list[list[Example]], n_flop: int, n_head: int, config) -> Count:
    """The counts of training on `batches` (one list of examples a step), alike for our packed
    rows and the peer's padded ones."""
    tokens = loss = 0
    flops = loss_flops = 0.0
    for batch in batches:
        lengths = [len(e.input_ids) for e in batch]
        labelled = sum(loss_positions(e) for e in batch)
        tokens += sum(lengths)
        loss += labelled
        flops += training_flops(n_flop, config, lengths)
        loss_flops += loss_training_flops(n_flop, n_head, config, lengths, labelled)
    return Count(tokens, loss, flops, loss_flops)
