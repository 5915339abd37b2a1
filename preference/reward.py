"""Preference reward: a trained Bradley-Terry reward model's score for each completion.

DeepSeek-R1's final RL stage scores general (non-reasoning) prompts with a reward model rather
than rules. The score is returned raw, not squashed:
- Bradley-Terry fixes scores only up to a constant (only differences enter the loss), so a
  sigmoid or a threshold would depend on an arbitrary offset the training happened to settle on;
- GRPO normalises rewards within each prompt's group, which removes any shift and scale, so the
  raw score carries the full ranking a squash could only compress at the extremes.
When it is summed with rule rewards on the same prompt, its config weight sets its scale.

Unlike the rule rewards this one holds a model, so it is a callable object built with the model
folder at run time and is not in the registry.
"""

from __future__ import annotations

from pathlib import Path

import torch

from models.loading import load_tokenizer
from preference.model import load_reward_model, score_pairs


class PreferenceReward:
    """`(prompts, completions, **columns) -> list[float | None]` from a saved reward model.

    Prompts may be raw questions or the rendered prompts the GRPO trainer passes (rl/trainer.py
    `score()`); a rendered one is not rendered twice. Completions are the sampled texts without
    the end-of-turn token, which is appended as in the reward model's training pairs.
    """

    def __init__(self, model_dir: str | Path, batch_size: int = 32, max_length: int = 512):
        self.model_dir = Path(model_dir)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.model = load_reward_model(self.model_dir, pad_token_id=self.tokenizer.pad_token_id)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.batch_size = batch_size
        self.max_length = max_length
        self.__name__ = "preference"  # read by code that names rewards after their function

    def __call__(
        self, prompts: list[str], completions: list[str], **_: object
    ) -> list[float | None]:
        if not completions:
            return []
        with torch.inference_mode():
            scores = score_pairs(
                self.model,
                self.tokenizer,
                prompts,
                completions,
                batch_size=self.batch_size,
                max_length=self.max_length,
            )
        return [float(s) for s in scores]
