"""A scheduled evaluation's verdict: its figures against the previous evaluation of the same
alias, the regressions beyond the allowed drop, and how they are shown (a markdown table for the
Prefect artifact, one message for the failed flow run)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from storage.eval_history import Evaluation
from storage.model_registry import RegisteredModel

WATCHED = ("pass_at_1", "general_score")  # the metrics a regression is judged on


class EvaluationRegression(RuntimeError):
    """The evaluated version is worse than the previous evaluation of its alias."""


@dataclass(frozen=True)
class EvaluationVerdict:
    """What an evaluation found, against the previous evaluation of the same alias."""

    model: RegisteredModel
    mlflow_run_id: str
    metrics: dict[str, float]
    previous: Evaluation | None
    regressions: list[str] = field(default_factory=list)

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
        }


def artifact_key(alias: str) -> str:
    """Prefect artifact keys take lowercase letters, digits and dashes only."""
    return "evaluation-" + re.sub(r"[^a-z0-9-]+", "-", alias.lower()).strip("-")


def verdict_markdown(
    verdict: EvaluationVerdict, max_drop: dict[str, float], tracking_uri: str
) -> str:
    """Current against previous figures, metric by metric, and the verdict."""
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
    lines.append("")
    if earlier is None:
        lines.append("**First evaluation of this alias**: nothing to compare with.")
    else:
        lines.append(
            f"Previous: version {earlier.version}, evaluated {earlier.evaluated_at:%Y-%m-%d %H:%M}"
            f" UTC (MLflow run {earlier.mlflow_run_id})."
        )
        lines.append("")
        if verdict.regressions:
            lines.append("**Regression**:")
            lines += [f"- {line}" for line in verdict.regressions]
        else:
            lines.append("**No regression.**")
    lines += ["", f"MLflow: {tracking_uri} run {verdict.mlflow_run_id}"]
    return "\n".join(lines) + "\n"


def verdict_line(verdict: EvaluationVerdict, max_drop: dict[str, float]) -> str:
    """The verdict in one line, as the flow run's log ends with it: `models:/r1-micro@final
    v13 held against v12: pass_at_1 0.640 (was 0.650), general_score ...; a drop over 0.020
    fails`, `... regressed against v12: ...`, or a first evaluation with nothing to compare."""
    model, earlier = verdict.model, verdict.previous
    now = {m: verdict.metrics[m] for m in max_drop if m in verdict.metrics}
    if earlier is None:
        figures = ", ".join(f"{m} {v:.3f}" for m, v in now.items())
        return f"{model.uri} v{model.version}: first evaluation, nothing to compare ({figures})"
    figures = ", ".join(f"{m} {v:.3f} (was {fmt(earlier.metrics.get(m))})" for m, v in now.items())
    held = "regressed" if verdict.regressions else "held"
    allowed = sorted(set(max_drop.values()))
    rule = f"a drop over {allowed[0]:.3f} fails" if len(allowed) == 1 else "see max_drop"
    return f"{model.uri} v{model.version} {held} against v{earlier.version}: {figures}; {rule}"


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
