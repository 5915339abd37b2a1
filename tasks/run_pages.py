"""What the MLflow UI shows first on a run's page: its description (the tag
`mlflow.note.content`), rendered as markdown at the top of the run's Overview.

Read in MLflow 3.17's UI bundle (`mlflow/server/js/build`, the run page's description box and
its charts): the description shows its first 100 pixels, about four lines, and hides the rest
behind "Show more"; the Model metrics tab orders its chart sections by metric-name prefix,
alphabetically, and keeps any rearrangement in the browser's local storage only, so the server
cannot put the reward curves first there. Each description therefore starts with what the run
holds and links to where MLflow shows it whole on one screen: the parent run's per-stage table
as a compact HTML page (the Artifacts view shows `report/stages.html` as it is), a GRPO stage's
reward, length and KL as one image, which the description also shows below its first lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mlflow import MlflowClient

from evaluation.curves import ends, families, plot_training_curves, series
from evaluation.report import StageRow, cell
from storage.tracking import alias_for

RUN_DESCRIPTION_TAG = "mlflow.note.content"
GUARD_TAG = "r1.guard"  # the RL guard's outcome on a GRPO stage run (tasks/guard_report.py)
MODEL_TRAINING = "?workflowType=machine_learning"
CURVES = "training_curves.png"
FINAL_ALIAS = alias_for("all_scenarios_rl")


def run_link(experiment: str, run_id: str, tail: str = "") -> str:
    """A link the MLflow UI follows within itself: a run's page, or one of its tabs (in its
    model-training view: it would else switch to its GenAI one)."""
    return f"#/experiments/{experiment}/runs/{run_id}{tail}{MODEL_TRAINING}"


def headline(rows: Sequence[StageRow], seconds: float) -> str:
    """`final model (all_scenarios_rl): pass@1 0.817, base (bootstrap) 0.709 · 16 stages, 21
    min of stage time`, from what the rows hold."""
    evaluated = [row for row in rows if "pass_at_1_lenient" in row.metrics]
    parts = []
    if evaluated:
        first = evaluated[0]
        final = next((r for r in evaluated if alias_for(r.stage) == FINAL_ALIAS), evaluated[-1])
        parts.append(
            f"final model ({final.stage}): pass@1 {cell(final.metrics, 'pass_at_1_lenient')}, "
            f"base ({first.stage}) {cell(first.metrics, 'pass_at_1_lenient')}"
        )
    parts.append(f"{len(rows)} stages, {seconds / 60:.0f} min of stage time")
    return " · ".join(parts)


def report_description(
    experiment: str, run_id: str, rows: Sequence[StageRow], markdown: str
) -> str:
    """The parent run's description: links to the table and the bar chart as MLflow shows them,
    the headline, then the markdown table itself (behind "Show more")."""
    table = run_link(experiment, run_id, "/artifacts/report/stages.html")
    chart = run_link(experiment, run_id, "/artifacts/report/stages.png")
    seconds = sum(row.seconds for row in rows)
    return (
        f"**Held-out figures after each stage**: [the table]({table}) · "
        f"[bar chart]({chart}) · {headline(rows, seconds)}\n\n"
        f"Below in full (Show more); each stage's run is among this run's children.\n\n{markdown}"
    )


def run_history(client: MlflowClient, run_id: str, keys: Sequence[str]) -> list[dict[str, float]]:
    """The run's points of `keys`, one dict per step, as evaluation.curves reads them."""
    by_step: dict[int, dict[str, float]] = {}
    for key in keys:
        for point in client.get_metric_history(run_id, key):
            by_step.setdefault(point.step, {"step": float(point.step)})[key] = point.value
    return [by_step[step] for step in sorted(by_step)]


def curve_keys(metrics: Sequence[str]) -> list[str]:
    """The GRPO metrics the curves show: the total reward, each family's and each term's,
    length, KL."""
    wanted = {"reward/mean", "completion/mean_tokens", "kl"}
    rewards = [k for k in metrics if k.startswith("reward/") and k.endswith("/mean")]
    return sorted(wanted & set(metrics)) + sorted(set(rewards) - wanted)


def curves_summary(history: Sequence[dict[str, float]]) -> str:
    """`200 steps: reward 0.12 → 0.45 · length 58 → 67 tokens · KL ...`, and on a line of its
    own `per family: math 0.30 → 0.52, ...`: each curve's mean over its first and last tenth."""

    def change(key: str, digits: int = 2) -> str:
        start, end = ends(series(history, key)[1])
        return f"{start:.{digits}f} → {end:.{digits}f}"

    steps = max((int(h["step"]) for h in history), default=0)
    text = f"{steps} steps: reward {change('reward/mean')}"
    if series(history, "completion/mean_tokens")[1]:
        text += f" · length {change('completion/mean_tokens', 0)} tokens"
    if series(history, "kl")[1]:
        text += f" · KL {change('kl', 4)}"
    names = families(history, "reward/family/")
    if names:  # a markdown line break: MLflow's box shows about four lines before "Show more"
        text += "  \nper family: " + ", ".join(
            f"{n} {change(f'reward/family/{n}/mean')}" for n in names
        )
    return text


def guard_line(tags: dict[str, str], experiment: str, run_id: str) -> str:
    """The guard's outcome first, where it is not plain clean: what tripped, and where its
    curves are."""
    outcome = tags.get(GUARD_TAG)
    if outcome in (None, "clean", "off"):
        return ""
    folder = run_link(experiment, run_id, "/artifacts/guard")
    trips = tags.get(f"{GUARD_TAG}.trips", "")
    return f"**Guard: {outcome}** ({trips}) · [record and curves]({folder})\n\n"


def describe_curves(client: MlflowClient, run_id: str, title: str, out_dir: Path) -> None:
    """A GRPO stage run's description: its curves summed up in a line, linked, and shown."""
    run = client.get_run(run_id)
    history = run_history(client, run_id, curve_keys(list(run.data.metrics)))
    if not any("reward/mean" in h for h in history):
        return
    plot = plot_training_curves(history, out_dir / CURVES, title)
    client.log_artifact(run_id, str(plot))
    experiment = run.info.experiment_id
    image = run_link(experiment, run_id, f"/artifacts/{CURVES}")
    charts = run_link(experiment, run_id, "/model-metrics")
    client.set_tag(
        run_id,
        RUN_DESCRIPTION_TAG,
        guard_line(run.data.tags, experiment, run_id)
        + f"**Training curves**: [reward, per family and term; length; KL]({image}) · "
        f"[every chart]({charts})\n\n"
        f"{curves_summary(history)}\n\n"
        f"![training curves](get-artifact?path={CURVES}&run_uuid={run_id})\n",
    )
