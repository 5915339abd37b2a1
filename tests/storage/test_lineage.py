"""The lineage chain over the DuckDB table, and `r1 lineage` on a real MLflow registry."""

import json
from pathlib import Path

import duckdb
import pytest

from cli.lineage import MODEL_DIGEST_TAG
from cli.main import main
from storage import store
from storage.lineage import InputRef, LineageError, LineageNode, chain
from storage.model_registry import ModelSpec, parse_model
from storage.paths import StatePaths
from storage.tracking import (
    alias_for,
    experiment_id,
    register_model,
    stage_run,
    start_pipeline_run,
    tracking_client,
)

# `r1` points the process environment at its state folder: each test gets its own copy.
pytestmark = pytest.mark.usefixtures("private_environment")

PROBLEMS, GENERAL, BASE, CURATED, SFT, RL, LOST = (
    f"{name:0<64}" for name in ("aa", "bb", "cc", "dd", "ee", "ff", "99")
)


def record(db: Path, digest: str, kind: str, stage: str, run: str, inputs: list[str]) -> None:
    store.record_lineage(db, f"runs/p/{stage}/{kind}", kind, digest, stage, run, inputs)


def ref(digest: str, run: str) -> InputRef:
    return InputRef(digest, run)


def shape(node: LineageNode) -> tuple:
    """(stage or kind, short digest, inputs) all the way down: what a chain must look like."""
    label = node.stage if node.known else node.kind
    if node.cycle:
        label = f"cycle:{label}"
    return (label, node.digest[:2], tuple(shape(child) for child in node.children))


@pytest.fixture(scope="module")
def lineage_db(tmp_path_factory) -> Path:
    """problems -> base -> curated -> SFT -> RL, base reached twice (a diamond), one lost input."""
    db = tmp_path_factory.mktemp("lineage") / "r1.duckdb"
    record(db, PROBLEMS, "problems", "problems", "pipeline", [])
    record(db, GENERAL, "problems", "general", "pipeline", [])
    record(db, BASE, "model", "bootstrap", "run-old", [GENERAL])  # an earlier run, superseded
    record(db, BASE, "model", "bootstrap", "run-base", [PROBLEMS])
    record(db, CURATED, "dataset", "cold_start_curation", "run-cur", [PROBLEMS, BASE])
    record(db, SFT, "model", "cold_start_sft", "run-sft", [BASE, CURATED])
    record(db, RL, "model", "reasoning_rl", "run-rl", [SFT, PROBLEMS, LOST])
    return db


def test_the_chain_reaches_the_problems_through_every_input(lineage_db):
    base = ("bootstrap", "cc", (("problems", "aa", ()),))
    curated = ("cold_start_curation", "dd", (("problems", "aa", ()), base))
    sft = ("cold_start_sft", "ee", (base, curated))
    expected = ("reasoning_rl", "ff", (sft, ("problems", "aa", ()), ("unknown", "99", ())))
    root = chain(lineage_db, RL)
    assert shape(root) == expected
    assert root.produced_by == "run-rl" and root.artifact == "runs/p/reasoning_rl/model"
    assert {leaf.kind for leaf in root.leaves()} == {"problems", "unknown"}
    assert root.run_ids() == {"run-rl", "run-sft", "run-cur", "run-base", "pipeline"}


def test_a_digest_recorded_twice_takes_the_latest_row_unless_a_run_is_named(lineage_db):
    assert chain(lineage_db, BASE).produced_by == "run-base"
    old = chain(lineage_db, BASE, run_id="run-old")
    assert shape(old) == ("bootstrap", "cc", (("general", "bb", ()),))


def test_an_unrecorded_digest_is_an_unknown_leaf(lineage_db):
    assert shape(chain(lineage_db, LOST)) == ("unknown", "99", ())


def test_a_cycle_ends_in_a_marked_leaf(tmp_path):
    db = tmp_path / "r1.duckdb"
    record(db, SFT, "model", "a", "run-a", [RL])
    record(db, RL, "model", "b", "run-b", [SFT])
    assert shape(chain(db, SFT)) == ("a", "ee", (("b", "ff", (("cycle:a", "ee", ()),)),))


def test_stages_that_produce_identical_bytes_stay_separate_links(tmp_path):
    """A GRPO stage that changed no weight records its policy's digest as its output: the chain
    follows the run each input came from, in this flow run and in a later one that took the
    earlier stages from the cache and produced the same bytes again."""
    db = tmp_path / "r1.duckdb"
    record(db, PROBLEMS, "problems", "problems", "pipeline", [])
    record(db, BASE, "model", "bootstrap", "run-base", [PROBLEMS])
    store.record_lineage(
        db, "sft", "model", SFT, "cold_start_sft", "run-sft", [ref(BASE, "run-base")]
    )
    for rl_run, final_run in (("run-rl", "run-final"), ("run-rl-2", "run-final-2")):
        store.record_lineage(
            db, "rl", "model", SFT, "reasoning_rl", rl_run, [ref(SFT, "run-sft"), PROBLEMS]
        )
        store.record_lineage(
            db, "final", "model", SFT, "all_scenarios_rl", final_run, [ref(SFT, rl_run)]
        )
        sft = ("cold_start_sft", "ee", (("bootstrap", "cc", (("problems", "aa", ()),)),))
        expected = (
            "all_scenarios_rl",
            "ee",
            (("reasoning_rl", "ee", (sft, ("problems", "aa", ()))),),
        )
        root = chain(db, SFT, final_run)
        assert shape(root) == expected
        assert [node.produced_by for node in root.walk()][:3] == [final_run, rl_run, "run-sft"]
        assert not any(node.cycle for node in root.walk())


def test_rows_written_with_bare_digests_still_read(tmp_path):
    db = tmp_path / "r1.duckdb"
    record(db, PROBLEMS, "problems", "problems", "pipeline", [])
    store.record_lineage(db, "base", "model", BASE, "bootstrap", "run-base", [])
    with duckdb.connect(str(db)) as con:  # an inputs column of a table written before runs
        con.execute(
            "UPDATE lineage SET inputs = ? WHERE digest = ?", [json.dumps([PROBLEMS]), BASE]
        )
    assert shape(chain(db, BASE)) == ("bootstrap", "cc", (("problems", "aa", ()),))


def test_the_chain_serialises_with_run_names(lineage_db):
    data = chain(lineage_db, CURATED).to_dict({"run-cur": "cold_start_curation"})
    assert data["run_name"] == "cold_start_curation" and data["kind"] == "dataset"
    assert [i["digest"] for i in data["inputs"]] == [PROBLEMS, BASE]
    assert json.loads(json.dumps(data)) == data


def test_a_missing_file_or_table_is_a_clear_error_and_nothing_is_created(tmp_path):
    db = tmp_path / "r1.duckdb"
    with pytest.raises(LineageError, match="no DuckDB file"):
        chain(db, RL)
    assert not db.exists()
    duckdb.connect(str(db)).close()
    with pytest.raises(LineageError, match="no lineage table"):
        chain(db, RL)


@pytest.mark.parametrize(
    "text, spec",
    [
        ("models:/r1-tiny@final", ModelSpec("r1-tiny", alias="final")),
        ("r1-tiny@cold-start", ModelSpec("r1-tiny", alias="cold-start")),
        ("models:/r1-tiny/3", ModelSpec("r1-tiny", version="3")),
    ],
)
def test_the_three_model_forms(text, spec):
    assert parse_model(text) == spec


@pytest.mark.parametrize("text", ["r1-tiny", "models:/r1-tiny", "models:/r1-tiny/v3", "a@b@c"])
def test_other_model_forms_are_refused(text):
    with pytest.raises(ValueError, match="expected models:/NAME@ALIAS"):
        parse_model(text)


# -- `r1 lineage` on a registry ------------------------------------------------------------------


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> dict[str, str]:
    """A state folder: two stages' models registered under their aliases, with lineage rows,
    and a third version whose run recorded no lineage."""
    paths = StatePaths(tmp_path_factory.mktemp("state")).ensure()
    client = tracking_client(paths)
    parent = start_pipeline_run(
        client, experiment_id(client, "r1-test", paths), "r1_pipeline-test", "flow-1", {}
    )
    db = paths.duckdb
    model_dir = paths.root / "model"
    model_dir.mkdir()
    (model_dir / "weights.bin").write_bytes(b"tiny")
    store.record_lineage(
        db, "runs/p/problems/train.jsonl", "problems", PROBLEMS, "problems", parent, []
    )
    runs = {"pipeline": parent}
    for stage, digest, inputs in (
        ("bootstrap", BASE, [PROBLEMS]),
        ("cold_start_sft", SFT, [BASE, CURATED]),
        ("reasoning_rl", RL, [SFT]),
    ):
        with stage_run(client, parent, stage, {}) as tracker:
            register_model(client, tracker.run_id, model_dir, "r1-test", alias_for(stage))
            if stage != "reasoning_rl":
                record(db, digest, "model", stage, tracker.run_id, inputs)
            runs[stage] = tracker.run_id
    record(db, CURATED, "dataset", "cold_start_curation", "run-cur", [PROBLEMS, BASE])
    with stage_run(client, parent, "mixed_sft", {}) as tracker:  # found by its digest tag only
        register_model(client, tracker.run_id, model_dir, "r1-test", alias_for("mixed_sft"))
        client.set_tag(tracker.run_id, MODEL_DIGEST_TAG, GENERAL)
    record(db, GENERAL, "model", "mixed_sft", "run-elsewhere", [BASE])
    return {"state": str(paths.root), **runs}


def lineage(registry: dict[str, str], *args: str) -> int:
    return main(["lineage", *args, "--state-dir", registry["state"]])


def test_lineage_prints_the_chain_to_the_problems(registry, capsys):
    assert lineage(registry, "models:/r1-test@cold-start") == 0
    out = capsys.readouterr().out
    assert "models:/r1-test@cold-start  version 2" in out
    for stage in ("cold_start_sft", "bootstrap"):
        assert f"run {registry[stage]} ({stage})" in out
    assert f"{PROBLEMS[:12]}  run {registry['pipeline']} (r1_pipeline-test)" in out
    assert "runs/p/problems/train.jsonl" in out and "run run-cur (not in the MLflow store)" in out
    assert "(inputs shown above)" in out  # the base is an input twice; its inputs drawn once
    assert f"raw problems reached: {PROBLEMS[:12]}" in out


def test_lineage_by_version_and_as_json(registry, capsys):
    assert lineage(registry, "models:/r1-test/1", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"] == {
        "uri": "models:/r1-test/1",
        "name": "r1-test",
        "version": "1",
        "run_id": registry["bootstrap"],
    }
    assert data["lineage"]["run_name"] == "bootstrap"
    assert [i["digest"] for i in data["lineage"]["inputs"]] == [PROBLEMS]
    assert data["problems"] == [PROBLEMS] and data["unknown"] == []


def test_a_run_without_a_model_row_is_found_by_its_digest_tag(registry, capsys):
    assert lineage(registry, "r1-test@rejection-sft") == 0
    out = capsys.readouterr().out
    assert f"mixed_sft  model  {GENERAL[:12]}  run run-elsewhere" in out
    assert f"raw problems reached: {PROBLEMS[:12]}" in out


@pytest.mark.parametrize(
    "model, message",
    [
        ("r1-test", "expected models:/NAME@ALIAS, NAME@ALIAS or models:/NAME/VERSION"),
        ("models:/nope@final", "no registered model 'nope' (registered: r1-test)"),
        ("r1-test@final", "model 'r1-test' has no alias 'final' (aliases: bootstrap, cold-start"),
        ("models:/r1-test/9", "model 'r1-test' has no version 9"),
        ("r1-test@reasoning-rl", "no lineage for models:/r1-test@reasoning-rl (version 3)"),
    ],
)
def test_lineage_errors_exit_2_naming_what_is_missing(registry, capsys, model, message):
    assert lineage(registry, model) == 2
    assert message in capsys.readouterr().err


def test_lineage_outside_a_state_folder_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert main(["lineage", "r1-test@final", "--state-dir", str(missing)]) == 2
    assert "no MLflow store at" in capsys.readouterr().err
    assert not missing.exists()
