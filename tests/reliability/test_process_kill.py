"""Each long stage, killed with SIGKILL at random moments and started again, ends exactly as a run
that was never interrupted: training (SFT and pretraining's loop), GRPO and on-policy
distillation reach the same weights and log each step's metrics once with the same values;
rejection sampling stores the same rollouts in DuckDB, each once, and keeps the same ones.

The stage runs in a process of its own (tests/reliability/stage_driver.py). The first kill comes
at a random moment after the first checkpoint (or the first committed chunk) exists, the second
at a random moment after the restart begins, which may be while it loads the checkpoint. The
moments are drawn from a seeded RNG (`R1_KILL_TEST_SEED`, default 0, to try other moments).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pytest
import torch

from models.saved import save_model
from tests.reliability import stage_driver as driver
from tests.tiny_models import make_tokenizer, tiny_model
from training.checkpoints import checkpoint_file, load_checkpoint, save_checkpoint

# Heavy: stages killed with SIGKILL at random moments, and restarted.
pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("R1_KILL_TEST_SEED", "0"))
RUN_SECONDS = 120.0  # a stage run that takes longer than this has hung
RESUMED = "train/resumed_from_step"
ROWS_PER_CHUNK = driver.REJECTION.chunk_prompts * driver.REJECTION.samples_per_prompt


class StageServer:
    """The client of stage_driver's command loop."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.stage_driver"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._read() == ["ready"]

    def _read(self) -> list[str]:
        assert self.proc.stdout is not None
        answer = self.proc.stdout.readline().split()
        assert answer, f"the stage driver died (exit code {self.proc.poll()})"
        return answer

    def _ask(self, line: str) -> list[str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._read()

    def start(self, stage: str, folder: Path, model_dir: Path | None) -> int:
        command = f"run {stage} {folder}" + (f" {model_dir}" if model_dir else "")
        kind, pid = self._ask(command)
        assert kind == "pid"
        return int(pid)

    def wait(self, pid: int, seconds: float = RUN_SECONDS) -> int:
        """The run's exit code (negative: killed by that signal); a run still going is killed."""
        answer = self._ask(f"wait {pid} {seconds}")
        if answer[0] == "running":
            os.kill(pid, signal.SIGKILL)
            self._ask(f"wait {pid} {RUN_SECONDS}")
            pytest.fail(f"run {pid} still running after {seconds} s")
        return int(answer[2])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server() -> Iterator[StageServer]:
    stages = StageServer()
    yield stages
    stages.close()


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    """The saved model rejection sampling draws from."""
    tokenizer = make_tokenizer()
    return save_model(tiny_model(tokenizer), tokenizer, tmp_path_factory.mktemp("policy")).path


# ---- watching a run ----------------------------------------------------------------------------


def wait_until(condition: Callable[[], bool], what: str, seconds: float = RUN_SECONDS) -> float:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {seconds} s"
        time.sleep(0.002)
    return time.monotonic()


def has_progress(stage: str, folder: Path) -> bool:
    """A checkpoint, or for rejection sampling a committed chunk, is on disk."""
    if stage == "rejection":
        return any(p.stat().st_size for p in folder.glob("chunks-*.txt"))
    return checkpoint_file(folder / "ckpt") is not None


def result_path(stage: str, folder: Path) -> Path:
    return folder / ("result.json" if stage == "rejection" else "result.pt")


def output(folder: Path, pid: int) -> str:
    path = folder / f"output-{pid}.txt"
    return path.read_text()[-4000:] if path.exists() else "(no output)"


@dataclass
class Attempts:
    """The runs of one stage into one folder, and what each found on disk when it started."""

    pids: list[int] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=lambda: [0])  # checkpoint step or rows
    kills: list[str] = field(default_factory=list)


def on_disk(stage: str, folder: Path) -> int:
    """What a restart resumes from: the checkpoint's step, or the rollouts stored."""
    if stage == "rejection":
        db = folder / "rollouts.duckdb"
        if not db.exists():
            return 0
        with duckdb.connect(str(db), read_only=True) as con:
            (rows,) = con.execute("SELECT count(*) FROM rollouts").fetchone()
        assert rows % ROWS_PER_CHUNK == 0, f"{rows} rows: a chunk was stored in part"
        return rows
    state = load_checkpoint(folder / "ckpt", driver.FINGERPRINT)
    return 0 if state is None else state["step"]


@dataclass
class Reference:
    """An uninterrupted run's pace: seconds from its start to its first checkpoint (`lead`) and
    from there to its end (`window`)."""

    lead: float
    window: float


def uninterrupted(
    server: StageServer, stage: str, folder: Path, model_dir: Path | None
) -> Reference:
    """Run the stage to its end; its pace."""
    pid = server.start(stage, folder, model_dir)
    began = time.monotonic()
    first = wait_until(lambda: has_progress(stage, folder), "first checkpoint")
    end = wait_until(lambda: result_path(stage, folder).exists(), "result")
    assert server.wait(pid) == 0, output(folder, pid)
    return Reference(lead=first - began, window=end - first)


def killed_and_restarted(
    server: StageServer, stage: str, folder: Path, model_dir: Path | None, reference: Reference
) -> Attempts:
    """Kill a run at a random moment after its first checkpoint, kill its restart at a random
    moment after it begins, then let a third run finish. The moments are fractions of the
    reference's window, shortened where this run reached its first checkpoint faster than the
    reference did (the machine's load changes while the test runs: a run twice as fast as its
    reference once ended before its kill); a slower run is killed earlier in its course, still
    after its first checkpoint."""
    rng = random.Random(f"{stage}-{SEED}")
    attempts = Attempts()
    window = reference.window
    for kill in range(2):
        pid = server.start(stage, folder, model_dir)
        began = time.monotonic()
        if kill == 0:
            started = began
            began = wait_until(lambda: has_progress(stage, folder), "first checkpoint")
            window = reference.window * min(1.0, (began - started) / reference.lead)
        delay = window * (rng.uniform(0.05, 0.45) if kill == 0 else rng.uniform(0.0, 0.25))
        time.sleep(max(0.0, began + delay - time.monotonic()))
        os.kill(pid, signal.SIGKILL)
        code = server.wait(pid)
        moment = f"kill {kill + 1} at {delay:.3f} s of a {window:.3f} s window (seed {SEED})"
        assert code == -signal.SIGKILL, (
            f"the run ended ({code}) before {moment}: {output(folder, pid)}"
        )
        assert not result_path(stage, folder).exists()
        attempts.pids.append(pid)
        attempts.kills.append(moment)
        attempts.resumed_from.append(on_disk(stage, folder))
    pid = server.start(stage, folder, model_dir)
    assert server.wait(pid) == 0, output(folder, pid)
    attempts.pids.append(pid)
    return attempts


# ---- metrics -----------------------------------------------------------------------------------

Records = list[tuple[int | None, dict[str, float]]]


def records(folder: Path, pid: int) -> Records:
    """A run's metric calls in order; a last line cut short by the kill is left out."""
    path = folder / f"metrics-{pid}.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    return [(r["step"], r["metrics"]) for r in map(json.loads, lines[:-1])]


def by_step(runs: list[Records]) -> dict[int, dict[str, float]]:
    """Step -> metrics, refusing a step logged twice; the resume marker is left out."""
    steps: dict[int, dict[str, float]] = {}
    for run in runs:
        for step, metrics in run:
            if RESUMED in metrics:
                continue
            assert step not in steps, f"step {step} logged twice"
            steps[step] = metrics
    return steps


def stitched(folder: Path, attempts: Attempts) -> dict[int, dict[str, float]]:
    """What the attempts logged, each for the steps from its checkpoint to the next attempt's:
    the metrics a run that was never interrupted would have."""
    bounds = [*attempts.resumed_from, float("inf")]
    kept = []
    for i, pid in enumerate(attempts.pids):
        run = records(folder, pid)  # empty when killed before it logged anything
        if run and attempts.resumed_from[i]:
            assert run[0][1] == {RESUMED: float(attempts.resumed_from[i])}, run[:1]
        kept.append([(s, m) for s, m in run if s is not None and bounds[i] < s <= bounds[i + 1]])
        by_step([run])  # no attempt logs a step twice
    return by_step(kept)


def assert_same_metrics(got: dict[int, dict[str, float]], want: dict[int, dict[str, float]]):
    assert sorted(got) == sorted(want)
    for step, metrics in want.items():
        assert got[step].keys() == metrics.keys()
        for key, value in metrics.items():
            if not key.startswith("time/"):  # wall-clock figures differ between runs
                assert got[step][key] == pytest.approx(value, abs=1e-6), (step, key)


# ---- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["sft", "grpo", "distill"])
def test_a_training_stage_killed_twice_ends_as_an_uninterrupted_run(server, tmp_path, stage):
    reference = uninterrupted(server, stage, tmp_path / "straight", None)
    attempts = killed_and_restarted(server, stage, tmp_path / "killed", None, reference)
    assert_same_end(tmp_path, attempts)


@pytest.mark.parametrize(
    "k", [pytest.param(0, marks=pytest.mark.slow), 1, pytest.param(2, marks=pytest.mark.slow)]
)
def test_asynchronous_grpo_killed_twice_ends_as_an_uninterrupted_run(server, tmp_path, policy, k):
    """Rollouts from a sampler process, drawn up to k steps ahead: the run killed twice stores
    the same sample rows (each with its policy version) and reaches the same curves and
    weights; what was drawn ahead at a kill was kept in the checkpoint or is drawn again."""
    stage = f"grpo-k{k}"
    reference = uninterrupted(server, stage, tmp_path / "straight", policy)
    attempts = killed_and_restarted(server, stage, tmp_path / "killed", policy, reference)
    assert_same_end(tmp_path, attempts)
    want = sorted((tmp_path / "straight" / "samples").glob("step_*.json"))
    assert len(want) == driver.ASYNC_GRPO[k].steps
    for table in want:
        rows = json.loads(table.read_text())
        assert json.loads((tmp_path / "killed" / "samples" / table.name).read_text()) == rows
        step = int(table.stem.split("_")[1])
        assert {r["policy_version"] for r in rows} == {max(0, step - 1 - k)}


def assert_same_end(tmp_path: Path, attempts: Attempts) -> None:
    """The killed run's weights, reward curve and metrics are the uninterrupted run's."""
    want = torch.load(tmp_path / "straight" / "result.pt", weights_only=False)
    got = torch.load(tmp_path / "killed" / "result.pt", weights_only=False)
    assert got["resumed_from"] == attempts.resumed_from[-1], attempts.kills
    for name, value in want["weights"].items():
        assert torch.allclose(got["weights"][name], value, atol=1e-6), (name, attempts.kills)
    assert got.get("curve") == pytest.approx(want.get("curve"), abs=1e-6)
    (straight_pid,) = {int(p.stem.split("-")[1]) for p in (tmp_path / "straight").glob("metrics-*")}
    want_metrics = by_step([records(tmp_path / "straight", straight_pid)])
    assert_same_metrics(stitched(tmp_path / "killed", attempts), want_metrics)


def stored(db: Path) -> tuple[list[tuple], int, list[tuple]]:
    """Every rollout (all columns but the insert time), the distinct keys, and the kept keys."""
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT * EXCLUDE (created_at) FROM rollouts ORDER BY prompt_id, sample_index"
        ).fetchall()
        (keys,) = con.execute(
            "SELECT count(*) FROM (SELECT DISTINCT prompt_id, sample_index, model_id FROM rollouts)"
        ).fetchone()
        kept = con.execute(
            "SELECT prompt_id, sample_index, rank FROM rejection_kept ORDER BY ALL"
        ).fetchall()
    return rows, keys, kept


def test_rejection_sampling_killed_twice_stores_each_rollout_once(server, tmp_path, policy):
    reference = uninterrupted(server, "rejection", tmp_path / "straight", policy)
    attempts = killed_and_restarted(server, "rejection", tmp_path / "killed", policy, reference)
    want_rows, want_keys, want_kept = stored(tmp_path / "straight" / "rollouts.duckdb")
    got_rows, got_keys, got_kept = stored(tmp_path / "killed" / "rollouts.duckdb")
    assert len(got_rows) == got_keys == want_keys == len(want_rows)  # none missing, none twice
    assert got_rows == want_rows, attempts.kills
    assert got_kept == want_kept
    result = json.loads((tmp_path / "killed" / "result.json").read_text())
    before = attempts.resumed_from[-1]  # rows stored when the last run began
    assert result["chunks_skipped"] == before // ROWS_PER_CHUNK
    assert result["inserted"] == result["sampled"] == len(want_rows) - before


# ---- the moments a random kill rarely hits -----------------------------------------------------


def test_every_state_a_kill_leaves_in_the_checkpoint_swap_resumes(tmp_path):
    """save_checkpoint writes last.tmp, renames last to last.old, last.tmp to last, and removes
    last.old: a kill between any two of these leaves a whole checkpoint that loads, and the next
    save goes through."""

    def state(step: int) -> dict:
        return {"step": step, "fingerprint": "fp"}

    save_checkpoint(tmp_path, state(1))
    (tmp_path / "last.tmp").mkdir()
    (tmp_path / "last.tmp" / "state.pt").write_bytes(b"cut short")  # killed in torch.save
    assert load_checkpoint(tmp_path, "fp") == state(1)

    (tmp_path / "last").rename(tmp_path / "last.old")  # killed between the two renames
    assert load_checkpoint(tmp_path, "fp") == state(1)
    save_checkpoint(tmp_path, state(2))
    assert load_checkpoint(tmp_path, "fp") == state(2) and not (tmp_path / "last.old").exists()

    (tmp_path / "last.old").mkdir()  # killed while last.old was being removed
    (tmp_path / "last.old" / "state.pt").write_bytes(b"half removed")
    assert load_checkpoint(tmp_path, "fp") == state(2)
    save_checkpoint(tmp_path, state(3))
    assert load_checkpoint(tmp_path, "fp") == state(3)
