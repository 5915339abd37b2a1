"""The guard's rules: each a pure function of a stage's metric history (one dict per step, as the
GRPO trainer logs it) and its settings (configs/guard.py), returning a `Trip` that names the
rule, the step, the window it read and its numbers (guard/trip.py), or None.
`reward_without_skill`, which reads the held-out probe, is in guard/skill.py.

The signals they read, all logged every step by the trainer (rl/trainer.py, rl/signals.py) or by
its held-out probe every `probe.every` steps:
`reward/<term>/mean` and `/share`, `heldout/[<family>/]pass_at_1[_lenient]`,
`completion/mean_tokens`, `completion/truncated_fraction`, `entropy`,
`groups/zero_spread_fraction`, `kl`, `reward/unscorable_fraction`, a verifier's verdict counts
`reward/<term>/<reason>`, `completion/repetition_rate`, `completion/language_consistency_rate`.
"""

from __future__ import annotations

from collections.abc import Sequence

from configs.guard import (
    Collapse,
    Drift,
    GamedTerm,
    JudgeTrouble,
    LanguageMixing,
    LengthRunaway,
    Repetition,
)
from guard.history import History, baseline, first, last_step, recent, series
from guard.trip import Trip, rounded, start_of, windowed


def risen_past(
    history: History, key: str, window: int, ceiling: float, rise: float
) -> tuple[float, float] | None:
    """(first window, last window) of `key` when the last is at least `ceiling` and at least
    `rise` above the first; else None."""
    found = baseline(history, key, window)
    if found is None or found[1] < ceiling or found[1] - found[0] < rise:
        return None
    return found


def length_runaway(history: History, rule: LengthRunaway) -> Trip | None:
    """The truncated share over the window past `max_truncated` and `truncated_rise` above the
    first window's, or the mean length past `max_growth` times the first window's."""
    now, w = last_step(history), rule.window
    cut = risen_past(
        history, "completion/truncated_fraction", w, rule.max_truncated, rule.truncated_rise
    )
    if cut is not None:
        return windowed(
            "length_runaway",
            now,
            w,
            f"{cut[1]:.2f} of completions cut at the token limit over steps "
            f"{start_of(now, w)}-{now} (first window {cut[0]:.2f}, bound {rule.max_truncated:.2f})",
            truncated_then=cut[0],
            truncated_now=cut[1],
        )
    length = baseline(history, "completion/mean_tokens", w)
    if length is None or length[1] < rule.max_growth * length[0]:
        return None
    return windowed(
        "length_runaway",
        now,
        w,
        f"mean length {length[0]:.0f} -> {length[1]:.0f} tokens "
        f"(x{length[1] / length[0]:.2f}, bound x{rule.max_growth:.2f})",
        length_then=length[0],
        length_now=length[1],
    )


def collapse(history: History, rule: Collapse) -> Trip | None:
    """Token entropy below `min_entropy_ratio` of the first window's, or nearly every group
    without reward spread where the first window was not."""
    now, w = last_step(history), rule.window
    entropy = baseline(history, "entropy", w)
    if entropy is not None and entropy[1] < rule.min_entropy_ratio * entropy[0]:
        return windowed(
            "collapse",
            now,
            w,
            f"token entropy {entropy[0]:.4f} -> {entropy[1]:.4f} over steps "
            f"{start_of(now, w)}-{now} (below x{rule.min_entropy_ratio:g} of its first window)",
            entropy_then=entropy[0],
            entropy_now=entropy[1],
        )
    zero = risen_past(
        history, "groups/zero_spread_fraction", w, rule.max_zero_spread, rule.zero_spread_rise
    )
    if zero is None:
        return None
    return windowed(
        "collapse",
        now,
        w,
        f"{zero[1]:.2f} of groups with no reward spread over steps {start_of(now, w)}-{now} "
        f"(first window {zero[0]:.2f}, ceiling {rule.max_zero_spread:.2f})",
        zero_spread_then=zero[0],
        zero_spread_now=zero[1],
    )


def drift(history: History, rule: Drift) -> Trip | None:
    now, w = last_step(history), rule.window
    kl = recent(series(history, "kl"), now, w)
    if kl is None or kl <= rule.max_kl:
        return None
    return windowed(
        "drift",
        now,
        w,
        f"KL to the reference {kl:.4f} over steps {start_of(now, w)}-{now} "
        f"(ceiling {rule.max_kl:g})",
        kl=kl,
    )


def accuracy_change(
    history: History, probe_key: str | None, verifier_keys: Sequence[str]
) -> float | None:
    """How much accuracy moved since the stage began: the held-out probe's last reading less its
    first, or, without a probe, the mean over the verifiers of their training pass rate's last
    ten steps less their first ten."""
    if probe_key is not None:
        probes = series(history, probe_key)
        if len(probes) >= 2:
            return probes[-1][1] - probes[0][1]
    now, changes = last_step(history), []
    for key in verifier_keys:
        points = series(history, key)
        start, end = first(points, 10), recent(points, now, 10)
        if start is not None and end is not None and now - 10 >= start[1]:
            changes.append(end - start[0])
    return sum(changes) / len(changes) if changes else None


def gamed_term(
    history: History,
    rule: GamedTerm,
    shaping: dict[str, float],
    probe_key: str | None,
    verifier_keys: Sequence[str],
) -> Trip | None:
    """A shaping term (`shaping`: name -> weight) adds `rise` more to the mean reward (weight x
    `reward/<term>/mean`) over the last window than over the stage's first, or its share of the
    total (`reward/<term>/share`) rose by `share_rise`, while accuracy rose by less than
    `accuracy_rise`."""
    now, w = last_step(history), rule.window
    for name, weight in shaping.items():
        mean = baseline(history, f"reward/{name}/mean", w)
        share = baseline(history, f"reward/{name}/share", w) or (0.0, 0.0)
        if mean is None:
            continue
        added, share_rise = weight * (mean[1] - mean[0]), share[1] - share[0]
        if added < rule.rise and share_rise < rule.share_rise:
            continue
        moved = accuracy_change(history, probe_key, verifier_keys)
        if moved is None or moved >= rule.accuracy_rise:
            continue
        return Trip(
            "gamed_term",
            now,
            start_of(now, w),
            f"{name} adds {weight * mean[0]:.3f} -> {weight * mean[1]:.3f} to the mean reward "
            f"(share {share[0]:.2f} -> {share[1]:.2f}) while accuracy moved {moved:+.3f}",
            {
                "added_then": rounded(weight * mean[0]),
                "added_now": rounded(weight * mean[1]),
                "share_then": rounded(share[0]),
                "share_now": rounded(share[1]),
                "accuracy_change": rounded(moved),
            },
            name,
        )
    return None


# keys beside a verifier's verdict counts (its unscorable samples are read as a share above)
_NOT_REASONS = ("mean", "std", "share", "unscorable", "unscorable_fraction")


def judge_trouble(history: History, rule: JudgeTrouble, verifiers: Sequence[str]) -> Trip | None:
    """Samples no reward could score, or those a reward term could not score among the samples
    it judges (`reward/<term>/unscorable_fraction`), above `max_unscorable`; or one of the
    judge's own failure `reasons` above `max_reason_share` of a verifier's verdicts; over the
    window."""
    now, w = last_step(history), rule.window
    keys = ["reward/unscorable_fraction"] + sorted(
        {
            k
            for h in history[-w:]
            for k in h
            if k.endswith("/unscorable_fraction") and k.count("/") == 2
        }
    )
    for key in keys:
        unscorable = recent(series(history, key), now, w)
        if unscorable is not None and unscorable > rule.max_unscorable:
            who = "samples" if key.count("/") == 1 else f"{key.split('/')[1]}'s samples"
            return Trip(
                "judge_trouble",
                now,
                start_of(now, w),
                f"{unscorable:.2f} of {who} unscorable over steps {start_of(now, w)}-{now} "
                f"(ceiling {rule.max_unscorable:.2f})",
                {"unscorable": rounded(unscorable)},
                "" if key.count("/") == 1 else key.split("/")[1],
            )
    return _reason_trouble(history, rule, verifiers, now)


def _reason_trouble(
    history: History, rule: JudgeTrouble, verifiers: Sequence[str], now: int
) -> Trip | None:
    w = rule.window
    steps = [h for h in history if now - w < h.get("step", 0) <= now]
    for name in verifiers:
        prefix = f"reward/{name}/"
        counts: dict[str, float] = {}
        for h in steps:
            for key, value in h.items():
                reason = key[len(prefix) :] if key.startswith(prefix) else ""
                if reason and "/" not in reason and reason not in _NOT_REASONS:
                    counts[reason] = counts.get(reason, 0.0) + value
        total = sum(counts.values())
        for reason in rule.reasons:
            share = counts.get(reason, 0.0) / total if total else 0.0
            if share > rule.max_reason_share:
                return Trip(
                    "judge_trouble",
                    now,
                    start_of(now, w),
                    f"{name}: {share:.2f} of verdicts are '{reason}' over steps "
                    f"{start_of(now, w)}-{now} (ceiling {rule.max_reason_share:.2f})",
                    {"share": rounded(share), "verdicts": total},
                    name,
                )
    return None


def repetition(history: History, rule: Repetition) -> Trip | None:
    now, w = last_step(history), rule.window
    rate = risen_past(history, "completion/repetition_rate", w, rule.max_rate, rule.rise)
    if rate is None:
        return None
    return windowed(
        "repetition",
        now,
        w,
        f"{rate[1]:.2f} of completions repeat themselves (first window {rate[0]:.2f}, "
        f"ceiling {rule.max_rate:.2f})",
        rate_then=rate[0],
        rate_now=rate[1],
    )


def language_mixing(history: History, rule: LanguageMixing) -> Trip | None:
    now, w = last_step(history), rule.window
    rate = baseline(history, "completion/language_consistency_rate", w)
    if rate is None or rate[0] - rate[1] < rule.fall:
        return None
    return windowed(
        "language_mixing",
        now,
        w,
        f"language-consistent share {rate[0]:.2f} -> {rate[1]:.2f} "
        f"(fall {rate[0] - rate[1]:.2f}, bound {rule.fall:.2f})",
        rate_then=rate[0],
        rate_now=rate[1],
    )
