"""Stage 6's preference reward model: a Bradley-Terry scorer for general (non-reasoning) prompts.

DeepSeek-R1 scores general prompts in its final RL stage with reward models trained on human
preferences (helpfulness on the summary, harmlessness on the whole response). The tiny world has
no human raters: its pairs come from problems/general.py, a good response against a bad one of a
named kind. The model starts from the base causal LM's body with a new scalar head, as the paper's
reward models start from the policy's family; `init: fresh` builds a small one from a config
instead. Held-out pairwise accuracy is reported before and after training, and per rejection kind
so one can see which faults the judge has learnt to see.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from configs.reinforcement import RewardModelConfig
from models.loading import load_tokenizer, parameter_count
from models.saved import ModelRef
from preference.model import build_reward_model, encode, load_reward_model, pair_texts
from preference.training import EncodedPair, evaluate_pairs, train_reward_model
from problems.general import PreferencePair
from problems.general_files import load_pairs
from stages.fingerprint import fingerprint
from stages.tracker import Tracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RewardModelRef:
    """A saved reward model (weights, config, tokenizer) and how well it judges held-out pairs."""

    path: Path
    heldout_accuracy: float
    accuracy_before: float
    n_pairs: int
    accuracy_by_kind: dict[str, float] = field(default_factory=dict)
    train_seconds: float = 0.0
    parameters: int = 0


def run(
    config: RewardModelConfig,
    base: ModelRef,
    pairs_train: Path,
    pairs_heldout: Path,
    out_dir: Path,
    tracker: Tracker,
) -> RewardModelRef:
    tokenizer = load_tokenizer(base.path)
    model = initial_model(config, base.path, tokenizer)
    max_length = config.train.max_length
    train = encode_pairs(tokenizer, load_pairs(pairs_train), max_length)
    heldout = encode_pairs(tokenizer, load_pairs(pairs_heldout), max_length)
    pad_id = tokenizer.pad_token_id
    before = evaluate_pairs(model, heldout, pad_id, config.eval_batch_size)
    tracker.log_metrics({f"heldout/{k}": v for k, v in before.items()}, 0)
    report = train_reward_model(
        model,
        train,
        config.train,
        out_dir / "checkpoints",
        fingerprint(config, base.path, pairs_train, len(train)),
        tracker.log_metrics,
        pad_id=pad_id,
    )
    after = evaluate_pairs(model, heldout, pad_id, config.eval_batch_size)
    tracker.log_metrics({f"heldout/{k}": v for k, v in after.items()}, report.steps)
    tracker.log_metrics(
        {"heldout/accuracy_before": before["accuracy"], "train/seconds": report.seconds}
    )
    log.info("reward model: held-out accuracy %.3f -> %.3f", before["accuracy"], after["accuracy"])
    model_dir = out_dir / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return RewardModelRef(
        path=model_dir,
        heldout_accuracy=after["accuracy"],
        accuracy_before=before["accuracy"],
        n_pairs=len(train),
        accuracy_by_kind={
            k.split("/", 1)[1]: v for k, v in after.items() if k.startswith("accuracy/")
        },
        train_seconds=report.seconds,
        parameters=parameter_count(model),
    )


def initial_model(
    config: RewardModelConfig, base_path: Path, tokenizer: PreTrainedTokenizerBase
) -> PreTrainedModel:
    """The untrained reward model; seeded, so the new head starts the same on every run."""
    torch.manual_seed(config.seed)
    if config.init == "fresh":
        return build_reward_model(
            config.model, len(tokenizer), tokenizer.pad_token_id, seed=config.seed
        )
    return load_reward_model(base_path, pad_token_id=tokenizer.pad_token_id)


def encode_pairs(
    tokenizer: PreTrainedTokenizerBase, pairs: list[PreferencePair], max_length: int
) -> list[EncodedPair]:
    """Token ids of prompt + chosen and prompt + rejected, the rejection kind as the group."""
    prompts = [p.prompt for p in pairs]
    chosen = encode(
        tokenizer, pair_texts(tokenizer, prompts, [p.chosen for p in pairs]), max_length
    )
    rejected = encode(
        tokenizer, pair_texts(tokenizer, prompts, [p.rejected for p in pairs]), max_length
    )
    return [EncodedPair(c, r, p.rejection) for c, r, p in zip(chosen, rejected, pairs, strict=True)]
