"""The RL guard's rules (guard/): each with its bounds and what it does when it trips.

Every bound is read over a window of steps, against the stage's own first window where it says
"rise" or "fall", so that one noisy step never trips a rule. The defaults were measured on the
honest tiny recipe (three world seeds) and on planted hacks (docs/guard.md); they are meant to
never fire on an honest run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from configs.strict import Strict

Action = Literal["off", "warn", "stop", "rollback"]
ACTION_HELP = (
    "off: not checked; warn: logged, the stage goes on (its model is not given the stage's "
    "alias); stop: the stage ends Failed, naming the rule, its numbers and the step; rollback: "
    "the stage goes on from the last checkpoint before the rule's window, adjusted"
)


class Rule(Strict):
    action: Action = Field("stop", description=ACTION_HELP)
    window: int = Field(10, ge=1, description="steps the rule's figures are averaged over")

    @field_validator("action", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        """YAML reads a bare `off` as false: it means off here."""
        return "off" if value is False else value


class RewardWithoutSkill(Rule):
    """The training reward of a family outgrows its held-out probe: the held-out pass@1 of a
    family, in its verifier's reading (strict or lenient), each reading the mean of the last
    `smooth` probes, now against its `reference` reading (the first, or the best so far); and
    the family verifier's training pass rate over the last `window` steps against the `window`
    steps up to that reference (the stage's first `window` steps at the earliest). Read when a
    probe lands."""

    window: int = Field(20, ge=1)
    reference: Literal["first", "best"] = Field(
        "first",
        description="the held-out reading the latest is set against: the stage's first, or the "
        "best so far (so that a hack that begins after honest gains is read from where they "
        "ended)",
    )
    smooth: int = Field(1, ge=1, description="held-out probes averaged into one reading")
    gap: float = Field(
        0.2,
        gt=0,
        description="the training pass rate gained at least this on the held-out pass@1 (a "
        "rise of the one, a fall of the other, or both; a held-out fall counted only past what "
        "the probe's sampling explains, guard/paired.py `sampling_allowance`) ...",
    )
    probe_fall: float = Field(
        0.0, description="... and the held-out pass@1 fell by at least this (0: did not rise)"
    )
    overpay: float | None = Field(
        0.05,
        gt=0,
        lt=1,
        description="a training verifier that is not the probe's own grader, graded on the "
        "probe's completions, pays at least this much more than the grader finds, and more than "
        "chance disagreement explains (guard/paired.py): a hole, from the first probe on, taken "
        "up or not; None: not read",
    )
    fall: float | None = Field(
        0.1,
        gt=0,
        lt=1,
        description="the held-out pass@1 of a family fell at least this on the same problems "
        "since an earlier probe of the stage, by more than the probe's sampling explains "
        "(guard/paired.py), while the family's training pass rate fell less than half as "
        "far: skill lost after honest gains while the training verifier goes on paying, "
        "whether or not that verifier is the grader's own; None: not read",
    )
    alpha: float = Field(
        0.01,
        gt=0,
        lt=1,
        description="each paired reading's false-alarm rate over a stage, per family, spent "
        "over its probes",
    )


class LengthRunaway(Rule):
    """Completions run to the limit: the truncated share above a bound (and well above the
    stage's first window's), or the mean length grown past a multiple of the first window's."""

    max_truncated: float = Field(0.5, gt=0, le=1)
    truncated_rise: float = Field(0.2, gt=0, le=1)
    max_growth: float = Field(2.0, gt=1, description="mean length over its first window's")


class Collapse(Rule):
    """The policy stops exploring: token entropy fallen below a fraction of the stage's first
    window's, or nearly every group left with one reward for all its samples (no signal), where
    it was not so at the start."""

    min_entropy_ratio: float = Field(
        0.25, gt=0, lt=1, description="entropy per token over its first window's"
    )
    max_zero_spread: float = Field(0.95, gt=0, le=1)
    zero_spread_rise: float = Field(
        0.2, gt=0, le=1, description="... and at least this much above the first window's"
    )


class Drift(Rule):
    """The policy leaves its reference: the KL to it above a ceiling (read only when the stage
    keeps a reference, beta > 0)."""

    window: int = Field(5, ge=1)
    max_kl: float = Field(1.0, gt=0)


class GamedTerm(Rule):
    """One shaping term (format, tags, language, length, repetition: not what accuracy is) takes
    over the reward: what it adds to the mean reward (weight x its mean) rises, or its share of
    the total does, while accuracy stays flat."""

    window: int = Field(10, ge=1)
    rise: float = Field(0.1, gt=0, description="of weight x the term's mean, first window to last")
    share_rise: float = Field(0.2, gt=0, le=1, description="of its share of the total reward")
    accuracy_rise: float = Field(
        0.05, description="accuracy counts as flat when it rose by less than this"
    )


class JudgeTrouble(Rule):
    """The verifiers cannot be trusted: unscorable samples above a share (of all samples, or of
    those one reward term judges), or one of the judge's own failure reasons above a share of a
    verifier's verdicts."""

    window: int = Field(5, ge=1)
    max_unscorable: float = Field(0.2, gt=0, le=1)
    max_reason_share: float = Field(0.5, gt=0, le=1)
    reasons: list[str] = Field(
        default_factory=lambda: ["sandbox_failed", "wall_time", "reply"],
        description="the verdict reasons that are the judge's trouble, not the candidate's",
    )


class Repetition(Rule):
    """Completions loop: the share that repeats itself (rl/signals.py) above a ceiling and well
    above the stage's first window."""

    max_rate: float = Field(0.5, gt=0, le=1)
    rise: float = Field(0.25, gt=0, le=1)


class LanguageMixing(Rule):
    """Completions mix scripts: the language-consistent share fallen below the first window's by
    more than `fall`."""

    fall: float = Field(0.2, gt=0, le=1)


class Rollback(Strict):
    """What a rollback changes, and how often it may happen before the guard stops instead."""

    max_times: int = Field(2, ge=0)
    learning_rate_factor: float = Field(0.5, gt=0, lt=1)
    term_weight_factor: float = Field(
        0.5, ge=0, lt=1, description="a gamed term's weight is multiplied by this"
    )
    reach_back: int = Field(
        0,
        ge=0,
        description="steps before the rule's window that a rollback goes back to (0: the last "
        "checkpoint before the window), for a hack taken up before the window began",
    )


class GuardConfig(Strict):
    """The guard on a GRPO stage: rules over the step metrics, checked after every step."""

    enabled: bool = True
    reward_without_skill: RewardWithoutSkill = RewardWithoutSkill()
    length_runaway: LengthRunaway = LengthRunaway()
    collapse: Collapse = Collapse()
    drift: Drift = Drift()
    gamed_term: GamedTerm = GamedTerm()
    judge_trouble: JudgeTrouble = JudgeTrouble()
    repetition: Repetition = Repetition()
    language_mixing: LanguageMixing = LanguageMixing()
    rollback: Rollback = Rollback()
    curve_steps: int = Field(
        30, ge=1, description="steps either side of a trip in the MLflow run's guard curves"
    )

    @model_validator(mode="after")
    def _rollback_possible(self) -> GuardConfig:
        rolling = [name for name, rule in self.rules().items() if rule.action == "rollback"]
        if rolling and self.rollback.max_times == 0:
            raise ValueError(
                f"{', '.join(rolling)}: action rollback with rollback.max_times 0; "
                "say stop instead, or allow rollbacks"
            )
        return self

    def rules(self) -> dict[str, Rule]:
        """Every rule's settings by its name."""
        return {
            name: getattr(self, name)
            for name in (
                "reward_without_skill",
                "length_runaway",
                "collapse",
                "drift",
                "gamed_term",
                "judge_trouble",
                "repetition",
                "language_mixing",
            )
        }
