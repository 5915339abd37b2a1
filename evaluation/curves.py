"""Plots of a GRPO run's history: the reward per step, overall and per family, and, when the run
probed held-out problems, pass@1 and response length over training (DeepSeek-R1's Figures 2 and 3
for R1-Zero, in miniature)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

from guard.history import PROBE_VERSION  # noqa: E402

History = Sequence[dict[str, float]]


def smoothed(values: list[float]) -> list[float]:
    """Mean of the last tenth of the run (at least one value) at each point."""
    window = max(1, len(values) // 10)
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
        for i in range(len(values))
    ]


def ends(values: Sequence[float]) -> tuple[float, float]:
    """The mean of the first and of the last tenth of `values` (at least one value each)."""
    if not values:
        return float("nan"), float("nan")
    window = max(1, len(values) // 10)
    return sum(values[:window]) / window, sum(values[-window:]) / window


def series(history: History, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `key` where the history has it; a probe read after the step it
    measured is placed at that step (its policy version)."""
    points = [(h.get(PROBE_VERSION, h["step"]), h[key]) for h in history if key in h]
    return [s for s, _ in points], [v for _, v in points]


def families(history: History, prefix: str) -> list[str]:
    """The names between `prefix` and the next "/" among the history's keys."""
    names = {k[len(prefix) :].split("/")[0] for h in history for k in h if k.startswith(prefix)}
    return sorted(names)


def plot_rewards(history: History, path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    steps, total = series(history, "reward/mean")
    ax.plot(steps, total, lw=1, alpha=0.35, color="black", label="total, per step")
    ax.plot(steps, smoothed(total), lw=2, color="black", label="total")
    for family in families(history, "reward/family/"):
        fsteps, values = series(history, f"reward/family/{family}/mean")
        ax.plot(fsteps, smoothed(values), lw=1.5, label=family)
    ax.set(xlabel="GRPO step", ylabel="mean total reward", title=title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_heldout(history: History, path: Path, title: str) -> Path:
    """Held-out pass@1 (each reading, each family) and response length over training."""
    fig, (acc, length) = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, label, style in (
        ("heldout/pass_at_1_lenient", "lenient", "-"),
        ("heldout/pass_at_1", "strict", "--"),
    ):
        steps, values = series(history, key)
        acc.plot(steps, values, style, marker="o", lw=2, color="black", label=f"all, {label}")
    for family in families(history, "heldout/"):
        if family.startswith(("pass_at", "mean_tokens")):
            continue
        steps, values = series(history, f"heldout/{family}/pass_at_1_lenient")
        acc.plot(steps, values, marker=".", lw=1, label=f"{family}, lenient")
    acc.set(xlabel="GRPO step", ylabel="held-out pass@1", title=f"{title}: accuracy")
    acc.legend(fontsize=8)
    steps, train = series(history, "completion/mean_tokens")
    length.plot(steps, train, lw=1, alpha=0.35, color="tab:blue")
    length.plot(steps, smoothed(train), lw=2, color="tab:blue", label="training samples")
    steps, held = series(history, "heldout/mean_tokens")
    length.plot(steps, held, marker="o", color="tab:orange", label="held-out responses")
    length.set(xlabel="GRPO step", ylabel="mean response tokens", title=f"{title}: length")
    length.legend(fontsize=8)
    return _save(fig, path)


def reward_terms(history: History) -> list[str]:
    """The reward's own terms (accuracy, format, ...): `reward/<term>/mean`, families aside."""
    names = {k.split("/")[1] for h in history for k in h if k.count("/") == 2}
    return sorted(n for n in names if f"reward/{n}/mean" in {k for h in history for k in h})


def plot_training_curves(history: History, path: Path, title: str) -> Path:
    """A GRPO run at a glance: the total reward and each family's, each reward term, the length
    of the sampled completions, and the KL to the reference (when the loss has one); each curve
    smoothed over a tenth of the run."""
    fig, axes = plt.subplots(2, 2, figsize=(9, 5.6))
    (total, terms), (length, kl) = axes
    steps, values = series(history, "reward/mean")
    total.plot(steps, values, lw=1, alpha=0.3, color="black")
    total.plot(steps, smoothed(values), lw=2, color="black", label="total")
    for family in families(history, "reward/family/"):
        fsteps, fvalues = series(history, f"reward/family/{family}/mean")
        total.plot(fsteps, smoothed(fvalues), lw=1.5, label=family)
    total.set(title=f"{title}: reward, per family")
    for term in reward_terms(history):
        tsteps, tvalues = series(history, f"reward/{term}/mean")
        terms.plot(tsteps, smoothed(tvalues), lw=1.5, label=term)
    terms.set(title="reward terms")
    steps, values = series(history, "completion/mean_tokens")
    length.plot(steps, values, lw=1, alpha=0.3, color="tab:blue")
    length.plot(steps, smoothed(values), lw=2, color="tab:blue")
    length.set(xlabel="GRPO step", title="completion length (tokens)")
    steps, values = series(history, "kl")
    if values:
        kl.plot(steps, smoothed(values), lw=2, color="tab:red")
    else:
        kl.text(0.5, 0.5, "no KL term (beta = 0)", ha="center", va="center")
    kl.set(xlabel="GRPO step", title="KL to the reference")
    for ax in (total, terms):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return _save(fig, path)


def plot_grpo_curves(history: History, out_dir: Path, title: str) -> list[Path]:
    """The run's plots, written under `out_dir`."""
    plots = [plot_rewards(history, out_dir / "reward_curve.png", title)]
    if any("heldout/pass_at_1" in h for h in history):
        plots.append(plot_heldout(history, out_dir / "heldout_curve.png", title))
    return plots


def plot_guard_trip(
    history: History, keys: Sequence[str], trip: dict, path: Path, margin: int
) -> Path:
    """The curves a guard rule read around its trip: each of `keys` over `margin` steps either
    side of the trip's window, the window shaded and the trip's step marked."""
    low, high = trip["since"] - margin, trip["step"] + margin
    shown = [k for k in keys if series(history, k)[1]] or list(keys[:1])
    fig, axes = plt.subplots(1, max(1, len(shown)), figsize=(4.2 * max(1, len(shown)), 3.2))
    for ax, key in zip(getattr(axes, "flat", [axes]), shown, strict=False):
        points = [(s, v) for s, v in zip(*series(history, key), strict=True) if low <= s <= high]
        if points:
            ax.plot(*zip(*points, strict=True), marker=".", lw=1.2)
        ax.axvspan(trip["since"], trip["step"], color="tab:red", alpha=0.12)
        ax.axvline(trip["step"], color="tab:red", lw=1)
        ax.set(xlabel="GRPO step", title=key)
    fig.suptitle(f"guard: {trip['rule']} at step {trip['step']}", fontsize=10)
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
