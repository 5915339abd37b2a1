"""What a guard rule returns when it fires: a `Trip` naming the rule, the step, the window it read
and its numbers."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Trip:
    """A rule that fired: at `step`, over the steps from `since` on, for `reason`."""

    rule: str
    step: int
    since: int
    reason: str
    numbers: dict[str, float] = field(default_factory=dict)
    subject: str = ""  # what it is about: a family, a reward term, a verifier

    def to_dict(self) -> dict:
        return {
            "rule": self.rule,
            "step": self.step,
            "since": self.since,
            "reason": self.reason,
            "numbers": self.numbers,
            "subject": self.subject,
        }


def start_of(now: int, window: int) -> int:
    """The first step of the window of `window` steps that ends at `now` (step 1 at the least)."""
    return max(1, now - window + 1)


def rounded(value: float) -> float:
    return round(value, 4)


def windowed(rule: str, now: int, window: int, reason: str, **numbers: float) -> Trip:
    """A trip over the `window` steps up to `now`, its numbers rounded."""
    return Trip(
        rule, now, start_of(now, window), reason, {k: rounded(v) for k, v in numbers.items()}
    )
