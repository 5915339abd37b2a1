"""`r1 lineage MODEL`: the chain from a registered model back to the raw problem set.

MODEL is `models:/NAME@ALIAS`, `NAME@ALIAS` or `models:/NAME/VERSION`. The registry (MLflow, in
the state folder) gives the version's stage run; the DuckDB lineage table gives what that run
produced and, input by input, what every earlier stage produced, down to the problem files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.text import Text
from rich.tree import Tree

from storage.lineage import (
    LineageError,
    LineageGone,
    LineageNode,
    LineageRow,
    chain,
    latest_rows,
    produced_by,
)
from storage.model_registry import RegistryError, ResolvedModel, parse_model, resolve
from storage.paths import StatePaths

# A stage run's own model digest, when a run sets it; the lineage row is looked up by run id first.
MODEL_DIGEST_TAG = "model.digest"


class LineageCommandError(Exception):
    """Something the command needs is missing; the message names it (exit code 2)."""


def state_paths(state_dir: str | None) -> StatePaths:
    """The state folder (`--state-dir`, else `$R1_STATE_DIR`, else ./state), which must exist."""
    paths = StatePaths(Path(state_dir).resolve()) if state_dir else StatePaths.from_env()
    if not paths.mlflow_db.is_file():
        raise LineageCommandError(f"no MLflow store at {paths.mlflow_db}: is this a state folder?")
    return paths


def registry(paths: StatePaths) -> Any:
    """An MLflow client on the state's store, its registry included (imported here: MLflow takes
    seconds to import)."""
    from storage.tracking import tracking_client

    return tracking_client(paths)


def model_row(db: Path, client: Any, model: ResolvedModel) -> LineageRow:
    """The lineage row of the model the version's run produced; else the run's digest tag."""
    row = produced_by(db, model.run_id, "model")
    if row is not None:
        return row
    tagged = run_tags(client, model.run_id).get(MODEL_DIGEST_TAG)
    row = latest_rows(db).get(tagged) if tagged else None
    if row is None:
        raise LineageCommandError(
            f"no lineage for {model.spec.uri} (version {model.version}): "
            f"no model row produced by run {model.run_id} in {db}"
        )
    return row


def run_tags(client: Any, run_id: str) -> dict[str, str]:
    from mlflow.exceptions import MlflowException

    try:
        return dict(client.get_run(run_id).data.tags)
    except MlflowException:
        return {}


def run_names(client: Any, run_ids: set[str]) -> dict[str, str]:
    """Each MLflow run's name; a run the store no longer holds is left out."""
    from mlflow.exceptions import MlflowException

    names: dict[str, str] = {}
    for run_id in sorted(run_ids):
        try:
            names[run_id] = client.get_run(run_id).info.run_name
        except MlflowException:
            continue
    return names


GUARD_TAG = "r1.guard"  # a GRPO stage run's guard outcome (tasks/guard_report.py)


def run_guards(client: Any, run_ids: set[str]) -> dict[str, str]:
    """The RL guard's outcome of each stage run that has one (`clean`, `warned`, `stopped`,
    `rolled back 1x, clean`), with what tripped when anything did."""
    guards = {}
    for run_id in sorted(run_ids):
        tags = run_tags(client, run_id)
        if GUARD_TAG in tags:
            trips = tags.get(f"{GUARD_TAG}.trips")
            guards[run_id] = tags[GUARD_TAG] + (f" ({trips})" if trips else "")
    return guards


NOT_IN_STORE = "not in the MLflow store"  # a run deleted there, or never recorded in it


def artifact_gone(artifact: str) -> bool:
    """Whether a file or folder a lineage row names by its whole path is no longer there (a
    stage folder deleted to free disk)."""
    return bool(artifact) and Path(artifact).is_absolute() and not Path(artifact).exists()


def node_label(
    node: LineageNode, names: dict[str, str], guards: dict[str, str] | None = None
) -> Text:
    """One line: stage, kind, short digest, run id and name, artifact path, and the RL guard's
    outcome of a GRPO stage."""
    short = node.digest[:12]
    if not node.known:
        return Text.assemble(("unknown ", "bold red"), (short, "cyan"), " (no lineage row)")
    run = f"run {node.produced_by} ({names.get(node.produced_by, NOT_IN_STORE)})"
    parts: list[str | tuple[str, str]] = [
        (node.stage, "bold"),
        f"  {node.kind}  ",
        (short, "cyan"),
        f"  {run}  ",
        (node.artifact, "dim"),
    ]
    if artifact_gone(node.artifact):
        parts.append((" (gone)", "bold red"))
    if node.cycle:
        parts.insert(0, ("cycle back to ", "bold yellow"))
    guard = (guards or {}).get(node.produced_by)
    if guard is not None:
        parts.append((f"  guard: {guard}", "green" if guard == "clean" else "bold red"))
    return Text.assemble(*parts)


def add_branch(
    tree: Tree,
    node: LineageNode,
    names: dict[str, str],
    shown: set[str],
    guards: dict[str, str] | None = None,
) -> None:
    """Add `node` under `tree`; a shared input's inputs (the same artifact of the same run) are
    drawn once, where it first appears."""
    label = node_label(node, names, guards)
    key = f"{node.digest}@{node.produced_by}"
    if node.children and key in shown:
        tree.add(label.append(" (inputs shown above)", "dim"))
        return
    shown.add(key)
    branch = tree.add(label)
    for child in node.children:
        add_branch(branch, child, names, shown, guards)


def render(
    model: ResolvedModel,
    root: LineageNode,
    names: dict[str, str],
    guards: dict[str, str] | None = None,
) -> Tree:
    title = Text.assemble(
        (model.spec.uri, "bold"), f"  version {model.version}  run {model.run_id}"
    )
    tree = Tree(title)
    add_branch(tree, root, names, set(), guards)
    return tree


def summary(root: LineageNode) -> dict[str, list[str]]:
    """The raw problem files the chain reaches and the inputs no stage recorded."""
    leaves = root.leaves()
    return {  # a problem file read from the user's own data has that file (kind `raw`) below it
        "problems": sorted({n.digest for n in root.walk() if n.kind == "problems"}),
        "unknown": sorted({n.digest for n in leaves if not n.known}),
    }


def as_json(
    model: ResolvedModel,
    root: LineageNode,
    names: dict[str, str],
    guards: dict[str, str] | None = None,
) -> str:
    body = {
        "model": {
            "uri": model.spec.uri,
            "name": model.spec.name,
            "version": model.version,
            "run_id": model.run_id,
        },
        "lineage": root.to_dict(names),
        "guard": guards or {},  # stage run id -> the RL guard's outcome
        **summary(root),
    }
    return json.dumps(body, indent=2)


def wide_console(renderable: Tree) -> Console:
    """A console wide enough that no line of `renderable` wraps or is cut."""
    probe = Console(width=10_000)
    needed = Measurement.get(probe, probe.options, renderable).maximum
    return Console(width=max(needed, Console().width))


def print_tree(
    model: ResolvedModel,
    root: LineageNode,
    names: dict[str, str],
    guards: dict[str, str] | None = None,
) -> None:
    tree = render(model, root, names, guards)
    console = wide_console(tree)
    console.print(tree)
    found = summary(root)
    console.print(f"raw problems reached: {', '.join(d[:12] for d in found['problems']) or 'none'}")
    if found["unknown"]:
        missing = ", ".join(d[:12] for d in found["unknown"])
        console.print(f"inputs with no lineage row: {missing}")
    nodes = [node for node in root.walk() if node.known]
    runs = sorted({n.produced_by for n in nodes if n.produced_by and n.produced_by not in names})
    gone = sorted({n.artifact for n in nodes if artifact_gone(n.artifact)})
    if runs:
        console.print(f"runs {NOT_IN_STORE}: {', '.join(runs)}")
    if gone:
        console.print(
            f"files gone: {len(gone)}; a run with the same settings computes again each stage "
            "of its own whose files are gone"
        )


# what a registered model whose lineage rows are gone needs (the model is there, so a pipeline ran)
LINEAGE_GONE = (
    "its lineage rows were deleted. Each stage writes its rows as it computes, and a run that "
    "takes the stages from the cache writes none: run the same r1 run command again with "
    "PREFECT_TASKS_REFRESH_CACHE=true to compute them again (training stages resume from "
    "their last checkpoints)"
)


def lineage_command(model: str, state_dir: str | None = None, json_output: bool = False) -> int:
    """Print the chain of `model`; 2 with a message naming what is missing, or the full disk
    that keeps the stores from being read."""
    paths = None
    try:
        spec = parse_model(model)
        paths = state_paths(state_dir)
        client = registry(paths)
        resolved = resolve(client, spec)
        row = model_row(paths.duckdb, client, resolved)
        root = chain(paths.duckdb, row.digest, row.produced_by)
    except LineageGone as err:
        print(f"r1: {err}, so {model} cannot be followed: {LINEAGE_GONE}", file=sys.stderr)
        return 2
    except (LineageCommandError, LineageError, RegistryError, ValueError) as err:
        print(f"r1: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        from storage.disk import full_disk_reading

        store = "MLflow's store (SQLite makes a file beside it to read it)"
        told = full_disk_reading(err, paths.root, store) if paths is not None else None
        if told is None:
            raise
        print(f"r1: {told}", file=sys.stderr)
        return 2
    names = run_names(client, root.run_ids())
    guards = run_guards(client, root.run_ids())
    if json_output:
        print(as_json(resolved, root, names, guards))
    else:
        print_tree(resolved, root, names, guards)
    return 0
