"""A scheduled evaluation's verdict: its figures against the latest earlier evaluation of the
same alias with the same settings (evaluation/settings.py) that did not itself regress, the
regressions beyond the allowed drop, and how they are shown (a markdown table for the Prefect
artifact, one line for the flow run's log, one message for the failed flow run). Where no earlier
evaluation has the same settings there is no verdict: what is shown names the settings that
differ instead."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from evaluation.settings import Difference, comparable, differences, same_settings, set_aside
from storage.eval_history import Evaluation, regressions
from storage.model_registry import RegisteredModel

WATCHED = ("pass_at_1", "general_score")  # the metrics a regression is judged on


class EvaluationRegression(RuntimeError):
    """The evaluated version is worse than the previous evaluation of its alias."""


@dataclass(frozen=True)
class EvaluationVerdict:
    """What an evaluation found, against the latest earlier evaluation of the same alias with
    the same settings (`previous`; None: there is none). When there is none but there are earlier
    evaluations, `unlike` is the latest of them and `unlike_settings` what differs from it (empty:
    its settings are unknown); otherwise `unlike_settings` are the general-only settings that
    differ from `previous`'s, which set the `set_aside` metrics aside."""

    model: RegisteredModel
    mlflow_run_id: str
    metrics: dict[str, float]
    previous: Evaluation | None
    regressions: list[str] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)
    unlike: Evaluation | None = None
    unlike_settings: list[Difference] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)  # watched metrics left out of `previous`'s
    passed_over: int = 0  # later evaluations than `previous`, with other settings
    regressed_since: int = 0  # later evaluations than `previous`, with its settings, that regressed

    @property
    def outcome(self) -> str:
        """`regression`, `ok` (compared, held or first), or `settings-differ` (no verdict)."""
        if self.regressions:
            return "regression"
        return "settings-differ" if self.previous is None and self.unlike is not None else "ok"

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.model.uri,
            "name": self.model.name,
            "alias": self.model.alias,
            "version": self.model.version,
            "model_digest": self.model.digest,
            "source_run_id": self.model.source_run_id,
            "mlflow_run_id": self.mlflow_run_id,
            "metrics": dict(self.metrics),
            "previous": None if self.previous is None else dict(self.previous.metrics),
            "previous_run_id": None if self.previous is None else self.previous.mlflow_run_id,
            "previous_version": None if self.previous is None else self.previous.version,
            "regressions": list(self.regressions),
            "verdict": self.outcome,
            "settings": dict(self.settings),
            "unlike_run_id": None if self.unlike is None else self.unlike.mlflow_run_id,
            "settings_differ": [d.line() for d in self.unlike_settings],
            "set_aside": list(self.set_aside),
        }


def judge(
    model: RegisteredModel,
    run_id: str,
    metrics: dict[str, float],
    settings: dict[str, str],
    earlier: list[Evaluation],
    max_drop: dict[str, float],
) -> EvaluationVerdict:
    """The verdict on an evaluation with `settings`, given the earlier evaluations of its alias
    (newest first): regressions against the latest with the same settings that did not regress
    itself (the general metrics set aside where only their own settings differ), or no verdict
    when none has them. A regression held against the evaluation before it would let the next
    night's figures, as low, pass against it: the drop stays judged until figures that hold
    against the baseline come back (or an evaluation with a larger `max_drop` accepts them)."""
    found = baseline(settings, earlier)
    if found is None:
        latest = earlier[0] if earlier else None
        known = latest.settings if latest is not None else None
        unlike = differences(known, settings) if known is not None else []
        return EvaluationVerdict(
            model, run_id, metrics, None, settings=settings, unlike=latest, unlike_settings=unlike
        )
    previous = earlier[found]
    unlike = differences(previous.settings or {}, settings)  # general-only ones at most
    aside = set_aside(max_drop, unlike)
    judged = {metric: drop for metric, drop in max_drop.items() if metric not in aside}
    regressed = sum(1 for e in earlier[:found] if comparable(e.settings, settings))
    return EvaluationVerdict(
        model,
        run_id,
        metrics,
        previous,
        regressions(previous.metrics, metrics, judged),
        settings=settings,
        unlike_settings=unlike,
        set_aside=aside,
        passed_over=found - regressed,
        regressed_since=regressed,
    )


def baseline(settings: dict[str, str], earlier: list[Evaluation]) -> int | None:
    """The index in `earlier` (newest first) of the evaluation to hold one with `settings` to:
    the latest comparable one that did not regress (the latest comparable one where all did);
    None when none is comparable."""
    kept = [i for i, e in enumerate(earlier) if not e.regressed]
    found = same_settings(settings, [earlier[i] for i in kept])
    return kept[found] if found is not None else same_settings(settings, earlier)


def artifact_key(alias: str) -> str:
    """Prefect artifact keys take lowercase letters, digits and dashes only."""
    return "evaluation-" + re.sub(r"[^a-z0-9-]+", "-", alias.lower()).strip("-")


def verdict_markdown(
    verdict: EvaluationVerdict, max_drop: dict[str, float], tracking_uri: str
) -> str:
    """Current against previous figures, metric by metric, the verdict, and the settings."""
    model, earlier = verdict.model, verdict.previous
    before = {} if earlier is None else earlier.metrics
    lines = [
        f"# Evaluation of {model.uri} (version {model.version})",
        "",
        "| metric | current | previous | change | allowed drop |",
        "|---|---:|---:|---:|---:|",
    ]
    for metric in sorted(set(verdict.metrics) | set(before)):
        now, then = verdict.metrics.get(metric), before.get(metric)
        change = f"{now - then:+.3f}" if now is not None and then is not None else "-"
        allowed = f"{max_drop[metric]:.3f}" if metric in max_drop else "-"
        lines.append(f"| {metric} | {fmt(now)} | {fmt(then)} | {change} | {allowed} |")
    lines += ["", *verdict_paragraph(verdict)]
    if verdict.settings:
        named = ", ".join(f"{name} {value}" for name, value in verdict.settings.items())
        lines += ["", f"Settings: {named}."]
    lines += ["", f"MLflow: {tracking_uri} run {verdict.mlflow_run_id}"]
    return "\n".join(lines) + "\n"


def verdict_paragraph(verdict: EvaluationVerdict) -> list[str]:
    """What the figures were compared with, and the verdict (or why there is none)."""
    earlier = verdict.previous
    if earlier is None and verdict.unlike is None:
        return ["**First evaluation of this alias**: nothing to compare with."]
    if earlier is None:
        return no_verdict_paragraph(verdict, verdict.unlike)
    lines = [
        f"Previous: version {earlier.version}, evaluated {earlier.evaluated_at:%Y-%m-%d %H:%M}"
        f" UTC (MLflow run {earlier.mlflow_run_id})."
    ]
    if verdict.passed_over:
        lines[0] += (
            f" The latest with the same settings: {verdict.passed_over} later evaluation(s) "
            "with other settings passed over."
        )
    if verdict.regressed_since:
        lines[0] += (
            f" {verdict.regressed_since} later evaluation(s) with the same settings regressed "
            "against it and are passed over: a drop stays a regression until the figures hold "
            "against this one again."
        )
    if verdict.set_aside:
        lines += ["", f"Not compared: {', '.join(verdict.set_aside)} ({changes(verdict)})."]
    lines.append("")
    if verdict.regressions:
        lines.append("**Regression**:")
        lines += [f"- {line}" for line in verdict.regressions]
    else:
        lines.append("**No regression.**")
    return lines


def no_verdict_paragraph(verdict: EvaluationVerdict, unlike: Evaluation) -> list[str]:
    """No earlier evaluation had these settings: which differ from the latest one's (`unlike`)."""
    head = (
        "**No verdict**: no earlier evaluation of this alias has the same settings. The latest, "
        f"version {unlike.version} evaluated {unlike.evaluated_at:%Y-%m-%d %H:%M} UTC (MLflow "
        f"run {unlike.mlflow_run_id}),"
    )
    if not verdict.unlike_settings:
        return [f"{head} recorded no settings (it ran before settings were recorded)."]
    return [f"{head} differs in:", *[f"- {d.line()}" for d in verdict.unlike_settings]]


def changes(verdict: EvaluationVerdict) -> str:
    return ", ".join(d.line() for d in verdict.unlike_settings)


def verdict_line(verdict: EvaluationVerdict, max_drop: dict[str, float]) -> str:
    """The verdict in one line, as the flow run's log ends with it: `models:/r1-micro@final
    v13 held against v12: pass_at_1 0.640 (was 0.650), general_score ...; a drop over 0.020
    fails`, `... regressed against v12: ...`, a first evaluation with nothing to compare, or
    `... no verdict: settings differ from v12's evaluation: temperature 0.7 -> 3.0 (...)`."""
    model, earlier = verdict.model, verdict.previous
    now = {m: verdict.metrics[m] for m in max_drop if m in verdict.metrics}
    if earlier is None:
        figures = ", ".join(f"{m} {v:.3f}" for m, v in now.items())
        return f"{model.uri} v{model.version}: {why_not_compared(verdict)} ({figures})"
    now = {m: v for m, v in now.items() if m not in verdict.set_aside}
    figures = ", ".join(f"{m} {v:.3f} (was {fmt(earlier.metrics.get(m))})" for m, v in now.items())
    held = "regressed" if verdict.regressions else "held"
    allowed = sorted(set(max_drop.values()))
    rule = f"a drop over {allowed[0]:.3f} fails" if len(allowed) == 1 else "see max_drop"
    if verdict.set_aside:
        rule += f"; {', '.join(verdict.set_aside)} not compared ({changes(verdict)})"
    return f"{model.uri} v{model.version} {held} against v{earlier.version}: {figures}; {rule}"


def why_not_compared(verdict: EvaluationVerdict) -> str:
    """`first evaluation...`, or why no verdict: the settings that differ, or unknown ones."""
    unlike = verdict.unlike
    if unlike is None:
        return "first evaluation, nothing to compare"
    if not verdict.unlike_settings:
        return f"no verdict, v{unlike.version}'s evaluation recorded no settings"
    return f"no verdict, settings differ from v{unlike.version}'s evaluation: {changes(verdict)}"


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def regression_message(verdict: EvaluationVerdict) -> str:
    """What regressed, naming each evaluation's own MLflow run: this version's and the earlier
    version's it is compared with."""
    earlier = verdict.previous
    against = ""
    if earlier is not None:
        against = f" against version {earlier.version} (its evaluation: MLflow run "
        against += f"{earlier.mlflow_run_id})"
    return (
        f"{verdict.model.uri} version {verdict.model.version} (this evaluation: MLflow run "
        f"{verdict.mlflow_run_id}) regressed{against}: " + "; ".join(verdict.regressions)
    )
