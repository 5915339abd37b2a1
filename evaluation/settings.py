"""An evaluation's settings: everything that changes what its figures measure, and how two
evaluations' settings are matched before their figures are compared.

Two evaluations of the same alias are compared only when they measured the same thing: the same
sampling (temperature, top_p, max_new_tokens, samples per problem, k, seed, engine), the same
held-out set (by the digest of the regenerated file, which covers its source, size and seed) cut
to the same size, and the same grading code (`verifiers`, a digest of the modules that grade and
summarise). The general prompts, how many of them are scored and the reward model that scores
them change only the `general_*` figures: when only they differ, the reasoning figures are still
compared and the general ones are set aside, named.

Settings are strings (as MLflow params and DuckDB rows keep them). An evaluation recorded before
settings were recorded has none (`None`): its settings are unknown, and it is never matched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from configs.reinforcement import EvalConfig
from storage.eval_history import Evaluation

Settings = Mapping[str, str]

GENERAL_ONLY = frozenset({"general_set", "general_prompts", "reward_model"})
GENERAL_PREFIX = "general_"  # the figures the settings in GENERAL_ONLY change
DIGEST_CHARS = 12  # of a digest kept as a setting: enough to tell two files apart, short to read
NONE = "none"


@dataclass(frozen=True)
class Difference:
    """One setting that two evaluations do not share (None: the evaluation lacks it)."""

    name: str
    before: str | None
    after: str | None

    def line(self) -> str:
        return f"{self.name} {self.before or 'unset'} -> {self.after or 'unset'}"


def evaluation_settings(
    config: EvalConfig,
    data_digests: Mapping[str, str],
    reward_model_digest: str | None,
    verifiers: str,
) -> dict[str, str]:
    """The settings of an evaluation with `config` of the held-out files whose digests are
    `data_digests` (`problems-heldout`, `general-eval_prompts`), scored by the reward model
    with that digest (None: none), graded by code of digest `verifiers`.

    Not settings: `batch_size` and where sampling runs (the same samples either way), and
    `max_drop` (the rule the figures are judged by, not what they measure)."""
    scored = reward_model_digest is not None and config.general_prompts > 0
    general = data_digests.get("general-eval_prompts")
    return {
        "temperature": str(config.temperature),
        "top_p": str(config.top_p),
        "max_new_tokens": str(config.max_new_tokens),
        "n_samples": str(config.n_samples),
        "k": str(config.k),
        "seed": str(config.seed),
        "sampler": sampler_setting(config),
        "max_problems": "all" if config.max_problems is None else str(config.max_problems),
        "heldout_set": short(data_digests["problems-heldout"]),
        "general_prompts": str(config.general_prompts) if scored else NONE,
        "general_set": short(general) if scored and general else NONE,
        "reward_model": short(reward_model_digest) if scored else NONE,
        "verifiers": short(verifiers),
    }


def sampler_setting(config: EvalConfig) -> str:
    """The engine that samples; vLLM's dtype changes its numbers, HF's engine has none."""
    sampler = config.sampler
    return sampler.backend if sampler.backend == "hf" else f"{sampler.backend} {sampler.dtype}"


def short(digest: str | None) -> str:
    return NONE if digest is None else digest[:DIGEST_CHARS]


def differences(before: Settings, after: Settings) -> list[Difference]:
    """The settings whose values differ, in name order; one missing on a side differs."""
    names = sorted(set(before) | set(after))
    return [
        Difference(n, before.get(n), after.get(n)) for n in names if before.get(n) != after.get(n)
    ]


def comparable(before: Settings | None, after: Settings) -> bool:
    """Whether figures of `before`'s evaluation can be compared with `after`'s: known settings
    that differ, if at all, only in what the general figures alone depend on."""
    if before is None:
        return False
    return all(d.name in GENERAL_ONLY for d in differences(before, after))


def same_settings(settings: Settings, earlier: Sequence[Evaluation]) -> int | None:
    """The index in `earlier` (newest first) of the latest evaluation comparable with one of
    `settings`, or None when none is."""
    return next((i for i, e in enumerate(earlier) if comparable(e.settings, settings)), None)


def set_aside(watched: Mapping[str, float], unlike: Sequence[Difference]) -> list[str]:
    """The watched metrics that `unlike` settings make incomparable (only general-only settings
    can differ between compared evaluations: they set aside the `general_*` metrics)."""
    if not any(d.name in GENERAL_ONLY for d in unlike):
        return []
    return [metric for metric in watched if metric.startswith(GENERAL_PREFIX)]
