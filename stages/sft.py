"""Stage 2 (and later SFT stages): supervised fine-tuning with the loss on completions only."""

from __future__ import annotations

from pathlib import Path

from datasets import load_from_disk

from configs.schema import SFTConfig
from models.chat import render_completion, render_prompt
from models.loading import load_model, load_tokenizer
from stages.fingerprint import fingerprint
from stages.refs import ModelRef, save_model
from stages.tracking import Tracker
from training.examples import sft_examples
from training.loop import train


def run(
    config: SFTConfig,
    base: ModelRef,
    dataset_path: Path,
    out_dir: Path,
    tracker: Tracker,
    desc: str = "sft",
) -> ModelRef:
    tokenizer = load_tokenizer(base.path)
    model = load_model(base.path)
    """Fine-tune `base` on a saved dataset with `question` and `completion` columns."""
    rows = load_from_disk(str(dataset_path))
    examples = sft_examples(
        tokenizer,
        [render_prompt(tokenizer, q) for q in rows["question"]],
        [render_completion(c) for c in rows["completion"]],
        config.train.max_length,
    )
    report = train(
        model,
        examples,
        config.train,
        out_dir / "checkpoints",
        fingerprint(config, base.path, dataset_path, len(examples)),
        tracker.log_metrics,
        pad_id=tokenizer.pad_token_id,
        desc=desc,
    )
    tracker.log_metrics(
        {"train/tokens_per_second": report.tokens_per_second, "train/steps": report.steps}
    )
    return save_model(model, tokenizer, out_dir)
