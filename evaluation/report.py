"""The per-stage report: one row per stage model, as markdown and as a plot.

The columns are the ones the DeepSeek-R1 paper reads its stages by: pass@1 and cons@k on the
held-out reasoning problems, overall and per family, the format and language-consistency rates,
and the reward model's score on held-out general prompts. pass@1 reads the answer wherever a
completion states it (lenient), which is what a base that never learned the format is fairly
judged by; "strict" beside it reads only the answer block, as the rewards do.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first


@dataclass(frozen=True)
class StageRow:
    """One line of the per-stage table."""

    stage: str
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    note: str = ""


def columns(k: int) -> list[tuple[str, str]]:
    """(title, metric key) of each figure column: pass@1 read wherever a completion states its
    answer (lenient), then read strictly, per family, and the rest."""
    return [
        ("pass@1", "pass_at_1_lenient"),
        ("strict", "pass_at_1"),
        ("math", "math/pass_at_1_lenient"),
        ("code", "code/pass_at_1_lenient"),
        ("logic", "logic/pass_at_1_lenient"),
        (f"pass@{k}", f"pass_at_{k}_lenient"),
        (f"cons@{k}", f"cons_at_{k}"),
        ("format", "format_rate"),
        ("lang. consistent", "language_consistency_rate"),
        ("general score", "general_score"),
    ]


def cell(metrics: dict[str, float], key: str) -> str:
    """The figure, with its standard error where the stage measured one (`<key>_sem`)."""
    if key not in metrics:
        return "-"
    sem = metrics.get(f"{key}_sem")
    return f"{metrics[key]:.3f}" if sem is None else f"{metrics[key]:.3f} ± {sem:.3f}"


LEGEND = (
    "pass@1, pass@k and the family columns (math, code, logic) read the answer wherever a "
    "completion states it: its answer block, else its last answer (lenient), so that a base "
    "that never learned the format is judged on its answers; strict pass@1 and cons@k read it "
    "only from the answer block, as the training rewards do."
)


def markdown_table(rows: Sequence[StageRow], k: int) -> str:
    cols = columns(k)
    lines = [
        "| stage | time | " + " | ".join(t for t, _ in cols) + " | notes |",
        "|---|---:|" + "---:|" * len(cols) + "---|",
    ]
    for row in rows:
        cells = " | ".join(cell(row.metrics, key) for _, key in cols)
        lines.append(f"| {row.stage} | {row.seconds:.0f}s | {cells} | {row.note} |")
    return "\n".join(lines) + "\n\n" + LEGEND


# A log line's room at 80 columns under `prefect deployment run --watch`, which puts up to 28
# characters of time and run id in front of each line
LINE_WIDTH = 52


def packed(items: Sequence[str], sep: str = ", ", width: int = LINE_WIDTH) -> list[str]:
    """`items` joined by `sep` into as few lines as hold them within `width` characters (an
    item longer than that has a line of its own)."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(sep) + len(item) <= width:
            lines[-1] += sep + item
        else:
            lines.append(item)
    return lines


def figure_lines(metrics: dict[str, float], k: int, width: int = LINE_WIDTH) -> list[str]:
    """A stage's held-out figures as the report's columns name them, a few a line within
    `width` (`pass@1 0.814, strict 0.790, math 0.850`); the figures it has only."""
    figures = [f"{title} {cell(metrics, key)}" for title, key in columns(k) if key in metrics]
    return packed(figures, ", ", width)


def stage_lines(rows: Sequence[StageRow]) -> list[str]:
    """The per-stage report one line a stage, narrow enough for an 80-column terminal under a
    log's prefix: the stage, its time, and for a model its held-out pass@1 and format rate, else
    its notes (`reasoning_rl  219s  pass@1 0.814  format 0.911`), and under a model whose
    stage's guard tripped, what tripped and that it was not registered. The whole table: the
    markdown table, the MLflow run's report."""
    width = max((len(row.stage) for row in rows), default=0)
    lines = []
    for row in rows:
        head = f"{row.stage:<{width}} {row.seconds:>4.0f}s"
        if "pass_at_1_lenient" in row.metrics:
            pass_at_1 = f"{row.metrics['pass_at_1_lenient']:.3f}"
            tail = f"pass@1 {pass_at_1} format {cell(row.metrics, 'format_rate')}"
        else:
            notes = [n for n in row.note.split(", ") if not n.startswith("cached from run")]
            tail = ", ".join(notes)
        lines += [fitted(f"{head}  {tail}".rstrip())]
        if "pass_at_1_lenient" in row.metrics and (tripped := GUARD_TRIPPED.search(row.note)):
            said = tripped.group(0).split(", not registered")
            parts = [said[0]] + [f"not registered{rest}" for rest in said[1:]]
            lines += [fitted(f"  {line}") for line in packed(parts, ", ", LINE_WIDTH - 2)]
    return lines


# a guard note other than `guard clean`: what tripped, and that the model was not registered
GUARD_TRIPPED = re.compile(
    r"guard (?!clean)(?:[^(,]|, clean)*?\([^)]*\)(?:, not registered as @[\w.-]+)?"
)


def fitted(line: str) -> str:
    """`line` cut to LINE_WIDTH, an ellipsis where it was cut."""
    return line if len(line) <= LINE_WIDTH else line[: LINE_WIDTH - 1] + "…"


HTML_STYLE = (
    "body{font-family:system-ui,sans-serif;font-size:12px;margin:8px;color:#11171c}"
    "table{border-collapse:collapse}"
    "th,td{padding:3px 7px;border-bottom:1px solid #dde;white-space:nowrap}"
    "th{text-align:left;background:#f4f6f8}td.n{text-align:right;font-variant-numeric:tabular-nums}"
    "p{max-width:60em;color:#5f7281}"
)


def html_table(rows: Sequence[StageRow], k: int) -> str:
    """The markdown table's cells as a page of their own, compact enough that every column
    shows at once where MLflow's Artifacts view shows an HTML file."""
    cols = columns(k)
    head = "".join(f"<th>{escape(t)}</th>" for t in ["stage", "time", *(t for t, _ in cols)])
    body = []
    for row in rows:
        figures = "".join(f'<td class="n">{escape(cell(row.metrics, key))}</td>' for _, key in cols)
        body.append(
            f'<tr><td>{escape(row.stage)}</td><td class="n">{row.seconds:.0f}s</td>{figures}'
            f"<td>{escape(row.note)}</td></tr>"
        )
    return (
        f"<!doctype html><meta charset='utf-8'><style>{HTML_STYLE}</style>"
        f"<table><tr>{head}<th>notes</th></tr>{''.join(body)}</table><p>{escape(LEGEND)}</p>"
    )


def table_dict(rows: Sequence[StageRow], k: int) -> dict[str, list[str]]:
    """Column -> cells as the markdown table shows them, the shape MLflow's log_table takes and
    its Artifacts view shows as a table (the figures themselves are the parent run's metrics)."""
    table = {"stage": [r.stage for r in rows], "time": [f"{r.seconds:.0f}s" for r in rows]}
    for title, key in columns(k):
        table[title] = [cell(r.metrics, key) for r in rows]
    table["notes"] = [r.note for r in rows]
    return table


def plot_stages(rows: Sequence[StageRow], k: int, path: Path) -> Path:
    """Grouped bars: each figure column for each evaluated stage."""
    evaluated = [r for r in rows if "pass_at_1" in r.metrics]
    shown = {"pass_at_1_lenient", "math/pass_at_1_lenient", "code/pass_at_1_lenient"}
    shown |= {"logic/pass_at_1_lenient", "format_rate", "language_consistency_rate"}
    keys = [(t, key) for t, key in columns(k) if key in shown]
    keys = [(t, key) for t, key in keys if any(key in r.metrics for r in evaluated)]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(evaluated) + 2), 4))
    width = 0.8 / max(len(keys), 1)
    for j, (title, key) in enumerate(keys):
        xs = [i + j * width for i in range(len(evaluated))]
        ax.bar(xs, [r.metrics.get(key, 0.0) for r in evaluated], width, label=title)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(evaluated))])
    ax.set_xticklabels([r.stage for r in evaluated], rotation=30, ha="right")
    ax.axhline(0, color="black", lw=0.5)  # the general score is a raw reward-model score
    ax.set(ylabel="rate / score", title="held-out figures after each stage")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
