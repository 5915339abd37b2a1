"""Reward functions by the names that configs use, and their weighted combination."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from contracts.reward_names import (
    BUILT_REWARDS,
    HOLED_REWARDS,
    RULE_REWARDS,
    RUNTIME_REWARDS,
    known_rewards,
)
from rewards.accuracy import accuracy_reward
from rewards.code import CodeReward
from rewards.countdown import countdown_reward
from rewards.format import format_reward
from rewards.holes import CodeTrustsOk, accuracy_digits_reward
from rewards.language import language_reward
from rewards.length import overlong_reward
from rewards.repetition import repetition_reward
from rewards.tags import tag_count_reward

RewardFn = Callable[..., list[float | None]]

REWARDS: dict[str, RewardFn] = {
    "accuracy": accuracy_reward,
    "countdown": countdown_reward,
    "format": format_reward,
    "tag_count": tag_count_reward,
    "language": language_reward,
    "overlong": overlong_reward,
    "repetition": repetition_reward,
}


def _grader(**params: Any) -> RewardFn:
    from graders.reward import grader_reward  # here: graders loads only when a config uses it

    return grader_reward(**params)


# Rewards built from their params when the config's rewards are built (a grader file, checked
# then, see docs/graders.md; the code reward, which counts its verdicts for `pop_metrics`).
FACTORIES: dict[str, Callable[..., RewardFn]] = {"grader": _grader, "code": CodeReward}
# Verifiers with a planted hole (faults.hacks): never used unless a profile names them.
HOLED: dict[str, Callable[..., RewardFn]] = {
    "accuracy_digits": lambda **params: partial(accuracy_digits_reward, **params),
    "code_trusts_ok": CodeTrustsOk,
}

if (
    set(REWARDS) != set(RULE_REWARDS)
    or set(FACTORIES) != set(BUILT_REWARDS)
    or set(HOLED) != set(HOLED_REWARDS)
):
    raise ImportError("rewards.registry must provide exactly the names in contracts.reward_names")


class RewardParamsError(ValueError):
    """A reward term's params that its reward does not take, or of the wrong type."""


def _settable(name: str) -> dict[str, inspect.Parameter] | None:
    """The params reward `name` takes: its function's (or factory's) keyword parameters with a
    default (those without one are a problem's columns); None where it checks its own."""
    if name in RUNTIME_REWARDS or name == "grader":  # the grader names its unknown params
        return None
    target: Any = {"accuracy_digits": accuracy_digits_reward}.get(name)
    target = target or REWARDS.get(name) or FACTORIES.get(name) or HOLED[name]
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {
        p.name: p
        for p in inspect.signature(target).parameters.values()
        if p.kind in keyword and p.default is not inspect.Parameter.empty
    }


def param_problems(name: str, params: dict[str, Any]) -> list[str]:
    """What is wrong with the params of a reward term `name`: a param it does not take (it would
    be ignored), or a value whose type is not its default's (`'200'` or 1e3 for a whole number)."""
    settable = _settable(name)
    if settable is None:
        return []
    problems = []
    for key, value in params.items():
        if key not in settable:
            known = ", ".join(settable) or "none"
            problems.append(f"reward {name!r} takes no param {key!r} (its params: {known})")
            continue
        default = settable[key].default
        if (
            default is None
            or isinstance(value, type(default))
            and not (isinstance(value, bool) and not isinstance(default, bool))
        ):
            continue
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            continue
        problems.append(
            f"reward {name!r} param {key!r} is {value!r}, not of type {type(default).__name__} "
            f"as its default {default!r} is"
        )
    return problems


def grader_problems(params: dict[str, Any]) -> list[str]:
    """What keeps a `grader` term's file from grading: the file loaded and checked as the stage
    would (a missing or unreadable file, a bad key, a python grader that cannot start)."""
    from graders.spec import GraderFileError

    try:
        _grader(**params)
    except GraderFileError as err:
        return [str(err)]
    return []


def check_reward_params(sections: dict[str, Sequence[Any]], graders: bool = True) -> None:
    """Raise RewardParamsError naming every reward term's bad params, by section: `sections`
    maps a dotted config path to its RewardTerms. With `graders`, each grader term's file is
    loaded too, so that a bad one stops a run before its first stage, not at its RL stage."""
    found = [
        f"{where}.rewards.{i}.params: {problem}"
        for where, terms in sections.items()
        for i, term in enumerate(terms)
        for problem in param_problems(term.name, term.params)
        + (grader_problems(term.params) if graders and term.name == "grader" else [])
    ]
    if found:
        raise RewardParamsError("reward params that cannot be used:\n  " + "\n  ".join(found))


def get_reward(name: str, **params: Any) -> RewardFn:
    """The reward called `name`, with `params` bound (e.g. overlong's max_tokens)."""
    if name in RUNTIME_REWARDS:
        raise KeyError(f"reward {name!r} ({RUNTIME_REWARDS[name]}) must be supplied by the stage")
    if name in FACTORIES:
        return FACTORIES[name](**params)
    if name in HOLED:
        return HOLED[name](**params)
    try:
        fn = REWARDS[name]
    except KeyError:
        raise KeyError(f"unknown reward {name!r}; known: {known_rewards()}") from None
    return partial(fn, **params) if params else fn


@dataclass(frozen=True)
class RewardSet:
    """A config's rewards as functions, weights, and the prompt kinds and problem families each
    one scores (None: all)."""

    fns: dict[str, RewardFn]
    weights: dict[str, float]
    kinds: dict[str, frozenset[str] | None]
    families: dict[str, frozenset[str] | None] = field(default_factory=dict)

    def applies(self, name: str, kind: str, family: str) -> bool:
        """Whether reward `name` scores a prompt of this kind and family."""
        kinds, families = self.kinds.get(name), self.families.get(name)
        if kinds is not None and kind not in kinds:
            return False
        return families is None or (kind == "reasoning" and family in families)

    @classmethod
    def from_terms(
        cls, terms: Sequence[Any], extra: dict[str, RewardFn] | None = None
    ) -> RewardSet:
        """`terms` are config RewardTerms; `extra` supplies the run-time rewards by name."""
        extra = extra or {}
        check_reward_params({"rewards": terms}, graders=False)  # built below, checked there
        return cls(
            fns={
                t.name: extra[t.name] if t.name in extra else get_reward(t.name, **t.params)
                for t in terms
            },
            weights={t.name: t.weight for t in terms},
            kinds={t.name: frozenset(t.kinds) if t.kinds else None for t in terms},
            families={t.name: frozenset(t.families) if t.families else None for t in terms},
        )


def safe_scores(
    fn: RewardFn, prompts: list[str], completions: list[str], **columns: Any
) -> list[float | None]:
    """Call a reward; a sample it fails on scores None (cannot be verified) instead of raising."""
    try:
        scores = fn(prompts, completions, **columns)
    except Exception:  # one malformed completion must not stop training
        scores = []
        for i in range(len(completions)):
            row = {k: v[i : i + 1] for k, v in columns.items()}
            try:
                scores += fn(prompts[i : i + 1], completions[i : i + 1], **row)
            except Exception:
                scores.append(None)
    if len(scores) != len(completions):
        raise ValueError(f"reward returned {len(scores)} scores for {len(completions)} completions")
    return scores


def verifier_metrics(fns: dict[str, RewardFn]) -> dict[str, float]:
    """What the rewards that count their verdicts (e.g. the code reward's failure reasons) saw
    since they were last asked, as `reward/<name>/<what>` counts."""
    metrics = {}
    for name, fn in fns.items():
        pop = getattr(fn, "pop_metrics", None)
        if callable(pop):
            metrics |= {f"reward/{name}/{key}": value for key, value in pop().items()}
    return metrics


def combine(
    per_reward: dict[str, Sequence[float | None]], weights: dict[str, float]
) -> list[float | None]:
    """Weighted sum per sample over the rewards that could score it; None if none could.

    A reward that cannot verify a sample (None) is left out of that sample's sum rather than
    counted as 0, so an unverifiable answer is not punished as a wrong one.
    """
    n = len(next(iter(per_reward.values())))
    total: list[float | None] = []
    for i in range(n):
        values = [(per_reward[name][i], w) for name, w in weights.items()]
        known = [v * w for v, w in values if v is not None]
        total.append(sum(known) if known else None)
    return total
