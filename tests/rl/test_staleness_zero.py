"""At max_staleness 0 (the default) a GRPO stage is the synchronous GRPO of the code before
asynchronous rollouts existed (commit 1e78e81): the same metric curves, the same sample rows,
the same figures byte for byte and the same weights. Both versions run the same stage on this
machine, each in a fresh interpreter over its own source tree; only additions are allowed:
the rollouts' policy version and staleness (0), and the sampler's time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # two fresh interpreters, two short GRPO stages each

ROOT = Path(__file__).resolve().parents[2]
BEFORE = "1e78e81"  # main before asynchronous rollouts
ADDED_METRICS = {"rollout/policy_version", "rollout/staleness", "time/sampler_seconds"}
# the RL guard's step signals (rl/signals.py) and the probe's time: new curves, nothing changed
GUARD_METRICS = {
    "completion/repetition_rate",
    "completion/language_consistency_rate",
    "time/signals_seconds",
    "time/probe_seconds",
}
GUARD_SUFFIXES = ("/share", "/unscorable_fraction")


def new_curve(key: str) -> bool:
    """Whether `key` is a metric added since 1e78e81 (asynchronous rollouts, the guard)."""
    guarded = key.startswith("reward/") and key.endswith(GUARD_SUFFIXES)
    return key in ADDED_METRICS or key in GUARD_METRICS or guarded


DRIVER = r"""
import json, sys
from pathlib import Path

import torch

from configs.reinforcement import ProbeConfig, RewardTerm
from models.saved import save_model
from problems.loader import write_problems
from problems.types import Problem, ProblemSet
from stages import reasoning_rl
from tests.tiny_models import PROBLEMS, grpo_config, make_tokenizer, tiny_model

out = Path(sys.argv[1])
torch.set_num_threads(1)
tokenizer = make_tokenizer()
policy = save_model(tiny_model(tokenizer), tokenizer, out / "policy")
heldout = [Problem(f"h{i}", f"What is {i} + 2?", str(i + 2)) for i in range(4)]
problems = ProblemSet(
    write_problems(out / "train.jsonl", PROBLEMS), write_problems(out / "heldout.jsonl", heldout),
    len(PROBLEMS), len(heldout),
)
configs = {
    "outcome": grpo_config(steps=4, samples_every=1, probe=ProbeConfig(every=2, problems=4)),
    "process": grpo_config(
        steps=3, supervision="process", beta=0.04, ref_refresh_every=2, samples_every=2,
        rewards=[RewardTerm(name="repetition", params={"chars": 2}), RewardTerm(name="format")],
    ),
}


class Recorder:
    def __init__(self):
        self.metrics, self.artifacts = [], []

    def log_metrics(self, metrics, step=None):
        self.metrics.append([step, metrics])

    def log_artifact(self, path, artifact_path=None):
        self.artifacts.append([str(Path(path).relative_to(out)), artifact_path])


for name, config in configs.items():
    tracker = Recorder()
    stage_dir = out / name
    model = reasoning_rl.run(config, policy, problems, stage_dir, tracker, desc=name)
    (stage_dir / "record.json").write_text(json.dumps(tracker.__dict__))
"""


def source_tree(commit: str, into: Path) -> Path:
    """The project's files at `commit`, from this checkout's git history."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the earlier code cannot be read")
    done = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, timeout=120
    )
    if done.returncode:
        pytest.skip(f"commit {commit} is not in this checkout's history: {done.stderr[-300:]!r}")
    with tarfile.open(fileobj=BytesIO(done.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def start_stage(tree: Path, out: Path) -> subprocess.Popen:
    """The driver's stages, run with `tree`'s code (first on the path) into `out`, on one torch
    thread, in a process of their own."""
    out.mkdir(parents=True)
    script = out.parent / f"{out.name}-driver.py"
    script.write_text(DRIVER)
    env = os.environ | {"PYTHONPATH": str(tree), "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    log = (out.parent / f"{out.name}.log").open("w")
    command = [sys.executable, str(script), str(out)]
    return subprocess.Popen(command, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """Both versions' stages, side by side (one thread each)."""
    base = tmp_path_factory.mktemp("staleness0")
    tree = source_tree(BEFORE, base / "tree")
    outs = (base / "before", base / "now")
    procs = [start_stage(tree, outs[0]), start_stage(ROOT, outs[1])]
    for proc, out in zip(procs, outs, strict=True):
        code = proc.wait(timeout=600)
        assert code == 0, (base / f"{out.name}.log").read_text()[-3000:]
    return outs


@pytest.mark.parametrize("stage", ["outcome", "process"])
def test_staleness_zero_gives_the_same_curves_rows_figures_and_weights(runs, stage):
    old, new = (root / stage for root in runs)
    before = json.loads((old / "record.json").read_text())
    now = json.loads((new / "record.json").read_text())
    assert [s for s, _ in now["metrics"]] == [s for s, _ in before["metrics"]]
    for (step, was), (_, metrics) in zip(before["metrics"], now["metrics"], strict=True):
        added = metrics.keys() - was.keys()
        assert all(new_curve(key) for key in added) and was.keys() <= metrics.keys(), step
        if "rollout/staleness" in metrics:
            assert metrics["rollout/staleness"] == 0.0
            assert metrics["rollout/policy_version"] == step - 1  # step s is logged as s + 1
        for key, value in was.items():
            if not key.startswith("time/"):
                assert metrics[key] == value, (step, key)  # exactly, not approximately
    guard_record = [path for path, folder in now["artifacts"] if folder == "guard"]
    assert [a for a in now["artifacts"] if a[1] != "guard"] == before["artifacts"]
    assert [Path(path).name for path in guard_record] == ["guard.json"]  # the guard's, added
    tables = sorted((old / "samples").glob("step_*.json"))
    assert tables
    for table in tables:
        rows = json.loads(table.read_text())
        got = json.loads((new / "samples" / table.name).read_text())
        assert [{k: v for k, v in r.items() if k != "policy_version"} for r in got] == rows
        step = int(table.stem.split("_")[1])
        assert {r["policy_version"] for r in got} == {step - 1}
    figures = sorted(p.name for p in old.glob("*.png"))
    assert figures and figures == sorted(p.name for p in new.glob("*.png"))
    for name in figures:
        assert (new / name).read_bytes() == (old / name).read_bytes(), name
    for name in ("model.safetensors", "config.json"):
        assert (new / "model" / name).read_bytes() == (old / "model" / name).read_bytes()
