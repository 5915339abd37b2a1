"""The GPU profile, configs/gpu-qwen.yaml, without a GPU or a hub.

Its downloads are replaced by stand-ins made here (tests/real_checkpoints.py: Qwen- and
Llama-style tokenizers and checkpoints, GSM8K-format files), its GPU settings by a few CPU
steps; then the flow runs for real under Prefect's test harness, with a real MLflow store and
DuckDB file. Without the downloads, `r1 run` and the flow stop at once, naming every one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import torch
import yaml
from datasets import load_from_disk
from mlflow import MlflowClient

from configs.preflight import MissingInputsError
from configs.profiles import PROFILES_DIR, merged, validate
from configs.schema import PipelineConfig
from models.chat import end_of_turn
from models.loading import load_tokenizer
from storage.digests import file_digest, tree_digest
from tests.real_checkpoints import make_stand_ins

ROOT = Path(__file__).resolve().parents[2]
GPU_PROFILE = PROFILES_DIR / "gpu-qwen.yaml"
TRAIN = {
    "epochs": 1,
    "batch_size": 8,
    "learning_rate": 1.0e-3,
    "warmup_steps": 1,
    "max_length": 256,
    "checkpoint_every": 50,
}
GRPO = {
    "steps": 1,
    "prompts_per_step": 2,
    "group_size": 2,
    "max_new_tokens": 32,
    "learning_rate": 1.0e-3,
    "checkpoint_every": 1,
    "samples_every": 1,
}
SAMPLING = {"max_new_tokens": 48, "batch_size": 32, "sampler": {"backend": "hf"}}
IN_PROCESS = {"engine": {"kind": "single", "precision": "fp32"}, "sampler": {"backend": "hf"}}
LENIENT = {
    "max_completion_tokens": 48,
    "require_correct": False,
    "require_well_formed": False,
    "min_language_share": None,
    "top_k": 1,
}
# What a 2-core CPU runs in seconds: the same stages, a few steps each, no vLLM or DeepSpeed.
CPU_SETTINGS = {
    "name": "r1-gpu-stand-in",
    "torch_threads": 1,  # models this small gain nothing from a second thread on a busy machine
    "data": {
        "general": {
            "n_sft": 16,
            "n_pairs_train": 32,
            "n_pairs_heldout": 8,
            "n_eval_prompts": 2,
            "n_rl_prompts": 4,
        }
    },
    "reward_model": {
        "model": {
            "hidden_size": 16,
            "num_layers": 1,
            "num_heads": 2,
            "num_kv_heads": 1,
            "intermediate_size": 32,
        },
        "train": TRAIN | {"max_length": 128},
        "eval_batch_size": 32,
    },
    "curation": {"filters": {"max_tokens": 256}},
    "cold_start_sft": {"train": TRAIN | {"epochs": 2}, "engine": {"kind": "single"}},
    "evaluation": SAMPLING | {"max_problems": 4, "n_samples": 2, "k": 2, "general_prompts": 2},
    "reasoning_rl": GRPO | IN_PROCESS,
    "rejection": SAMPLING
    | {"reasoning_prompts": 8, "general_prompts": 2, "samples_per_prompt": 2, "chunk_prompts": 8}
    | {"funnel": LENIENT},
    "mixed_sft": {"train": TRAIN, "engine": {"kind": "single"}},
    "all_scenarios_rl": GRPO | IN_PROCESS | {"general_prompts": 2},
    "distillation": {
        "traces": SAMPLING
        | {"reasoning_prompts": 8, "samples_per_prompt": 2, "chunk_prompts": 8, "funnel": LENIENT},
        "sft": TRAIN,
        "engine": {"kind": "single"},
        "rl_twin": IN_PROCESS,
        "rl_twins": False,
    },
}


def gpu_profile(inputs: dict[str, Path], cpu: bool = True) -> PipelineConfig:
    """configs/gpu-qwen.yaml pointed at `inputs` (as `--set` would), on CPU settings or not."""
    data = yaml.safe_load(GPU_PROFILE.read_text(encoding="utf-8"))
    data = merged(data, CPU_SETTINGS) if cpu else data
    data["bootstrap"]["path"] = str(inputs["policy"])
    data["data"]["files"] |= {
        "train_path": str(inputs["train"]),
        "heldout_path": str(inputs["test"]),
    }
    for student in data["distillation"]["students"]:
        student["path"] = str(inputs[student["name"]])
    return validate(data, "gpu-qwen (stand-ins)")


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> dict[str, Path]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return make_stand_ins(tmp_path_factory.mktemp("downloads"))
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gpu_run(prefect_server, stand_ins, tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    mp = pytest.MonkeyPatch()
    mp.setenv("R1_STATE_DIR", str(state))
    from flows.r1_pipeline import r1_pipeline

    result = r1_pipeline(config=gpu_profile(stand_ins))
    yield state, result
    mp.undo()


def stage_runs(state: Path, result) -> dict:
    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    parent = client.get_run(result.parent_run_id)
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{result.parent_run_id}'",
    )
    return {r.data.tags["r1.stage"]: r for r in children}


def test_the_profile_validates_as_written():
    config = gpu_profile(
        {"policy": Path("p"), "qwen": Path("q"), "llama": Path("l")}
        | {"train": Path("t.jsonl"), "test": Path("h.jsonl")},
        cpu=False,
    )
    assert config.curation.source == "solutions"
    assert config.evaluation.sampler.backend == config.rejection.sampler.backend == "vllm"
    for grpo in (config.reasoning_rl, config.all_scenarios_rl, config.distillation.rl_twin):
        assert (grpo.engine.kind, grpo.engine.precision, grpo.sampler.backend) == (
            "deepspeed",
            "bf16",
            "vllm",
        )
    assert config.distillation.engine.kind == config.mixed_sft.engine.kind == "deepspeed"
    assert {s.name: s.hub_id for s in config.distillation.students} == {
        "qwen": "Qwen/Qwen2.5-0.5B-Instruct",
        "llama": "meta-llama/Llama-3.2-1B-Instruct",
    }


@pytest.mark.heavy
def test_the_run_completes_on_the_stand_ins(gpu_run):
    _, result = gpu_run
    stages = [r.stage for r in result.rows]
    assert stages[:2] == ["bootstrap", "reward_model"]
    assert {"student_base_qwen", "student_qwen", "student_base_llama", "student_llama"} <= set(
        stages
    )
    by_stage = {r.stage: r for r in result.rows}
    assert "pass_at_1" in by_stage["student_llama"].metrics  # every model was evaluated
    assert by_stage["bootstrap"].note.endswith("checkpoint Qwen/Qwen2.5-1.5B-Instruct")


@pytest.mark.heavy
def test_the_base_is_the_checkpoint_untrained(gpu_run, stand_ins):
    state, result = gpu_run
    run = stage_runs(state, result)["bootstrap"]
    assert run.data.tags["r1.checkpoint"] == str(stand_ins["policy"].resolve())
    assert run.data.tags["r1.checkpoint.hub_id"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert run.data.tags["model.digest"] == tree_digest(stand_ins["policy"])
    assert not any(k.startswith("train/") for k in run.data.metrics)  # no training step logged
    assert not list((state / "runs").glob("bootstrap/*/checkpoints"))
    assert run.data.metrics["model/embedding_rows"] > run.data.metrics["model/tokenizer_tokens"]


@pytest.mark.heavy
def test_curation_took_the_data_sets_solutions(gpu_run):
    state, result = gpu_run
    run = stage_runs(state, result)["cold_start_curation"]
    assert result.filter_counts["no_solution"] == 2  # the two bare `#### n` rows
    assert list(result.filter_counts)[0] == "no_solution"
    with duckdb.connect(str(state / "r1.duckdb"), read_only=True) as con:
        (dataset,) = con.execute(
            "SELECT artifact FROM lineage WHERE stage = 'cold_start_curation'"
        ).fetchone()
        filters = dict(
            con.execute(
                "SELECT filter, removed FROM curation_filters WHERE stage_run_id = ?",
                [run.info.run_id],
            ).fetchall()
        )
    assert filters == result.filter_counts
    rows = load_from_disk(dataset)
    assert len(rows) == run.data.metrics["curation/kept"] >= 30  # of 38 with a solution
    for row in rows:
        assert row["completion"].startswith("<think> ") and "<<" not in row["completion"]
        assert row["completion"].endswith(f"<answer> The answer is {row['answer']}. </answer>")


@pytest.mark.heavy
def test_the_students_came_from_their_paths(gpu_run, stand_ins):
    state, result = gpu_run
    runs = stage_runs(state, result)
    for name, model_type, end in (
        ("qwen", "qwen2", "<|im_end|>"),
        ("llama", "llama", "<|eot_id|>"),
    ):
        base = runs[f"student_base_{name}"]
        assert base.data.tags["r1.checkpoint"] == str(stand_ins[name].resolve())
        assert base.data.tags["model.digest"] == tree_digest(stand_ins[name])
        with duckdb.connect(str(state / "r1.duckdb"), read_only=True) as con:
            (artifact, inputs) = con.execute(
                "SELECT artifact, inputs FROM lineage WHERE stage = ?", [f"student_{name}"]
            ).fetchone()
        assert base.data.tags["model.digest"] in [i["digest"] for i in json.loads(inputs)]
        config = json.loads((Path(artifact) / "config.json").read_text())
        assert config["model_type"] == model_type
        assert end_of_turn(load_tokenizer(artifact)) == end


@pytest.mark.heavy
def test_the_flow_stops_at_once_naming_what_is_missing(
    prefect_server, stand_ins, tmp_path, monkeypatch
):
    from flows.r1_pipeline import r1_pipeline

    missing = {"policy": tmp_path / "no-policy", "test": tmp_path / "no-test.jsonl"}
    config = gpu_profile(stand_ins | missing)
    monkeypatch.setenv("R1_STATE_DIR", str(tmp_path / "state"))
    with pytest.raises(MissingInputsError) as err:
        r1_pipeline(config=config)
    assert [m.input.key for m in err.value.missing] == ["bootstrap.path", "data.files.heldout_path"]
    assert str(missing["policy"]) in str(err.value) and str(missing["test"]) in str(err.value)
    assert not (tmp_path / "state" / "mlflow.db").exists()


def test_r1_run_exits_at_once_naming_every_missing_input(tmp_path):
    """In a folder without the downloads: every input is named with its key and a way to get
    it, and the command ends before any store is opened."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--profile", str(GPU_PROFILE)]
        + ["--state-dir", str(tmp_path / "state")],
        cwd=tmp_path,
        env=env | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    err = done.stderr
    for key, path in (
        ("bootstrap.path", "checkpoints/Qwen2.5-1.5B-Instruct"),
        ("distillation.students[0].path", "checkpoints/Qwen2.5-0.5B-Instruct"),
        ("distillation.students[1].path", "checkpoints/Llama-3.2-1B-Instruct"),
        ("data.files.train_path", "data/gsm8k/train.jsonl"),
        ("data.files.heldout_path", "data/gsm8k/test.jsonl"),
    ):
        assert f"{key} = {path}" in err
        assert f"looked in {tmp_path / path}: no such " in err
    assert "hf download meta-llama/Llama-3.2-1B-Instruct --local-dir " in err
    assert "5 local input(s) missing" in err
    assert not (tmp_path / "state" / "mlflow.db").exists()


CHECK_ALONE = """
import json, sys
from configs.profiles import load_profile
from configs.preflight import MissingInputsError, check_inputs
try:
    check_inputs(load_profile(sys.argv[1]))
except MissingInputsError as err:
    heavy = sorted({"torch", "transformers"} & set(sys.modules))
    print(json.dumps({"missing": [m.input.key for m in err.missing], "heavy": heavy}))
"""


def test_the_check_alone_reads_files_and_imports_no_model_library(stand_ins, tmp_path):
    """What makes the check instant: it never imports torch or transformers."""
    config = gpu_profile(stand_ins | {"llama": tmp_path / "nothing"}, cpu=False)
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", CHECK_ALONE, str(profile)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == {"missing": ["distillation.students[1].path"], "heavy": []}


@pytest.mark.heavy
def test_the_problem_files_lineage_reaches_the_users_own_files(gpu_run, stand_ins):
    """Below each problem file the run wrote: the data set file it read, by its content."""
    state, _ = gpu_run
    with duckdb.connect(str(state / "r1.duckdb"), read_only=True) as con:
        raw = dict(
            con.execute("SELECT artifact, digest FROM lineage WHERE kind = 'raw'").fetchall()
        )
        problems = con.execute("SELECT inputs FROM lineage WHERE kind = 'problems'").fetchall()
    for split in ("train", "test"):
        assert raw[str(stand_ins[split].resolve())] == file_digest(stand_ins[split])
    assert {i["digest"] for (inputs,) in problems for i in json.loads(inputs)} == set(raw.values())
