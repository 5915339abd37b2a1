"""The prepared GPU session (scripts/gpu_session.sh) rehearsed on CPU, every size cut: each step
runs to its end within the budget and leaves its log, and a step the budget cannot hold is cut
and said, not left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training import distributed

ROOT = Path(__file__).resolve().parents[2]


def session(
    tmp_path: Path, budget: int, reserve: int, shortest: int = 20
) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    env = os.environ | {
        "OUT": str(out), "R1_SESSION_REHEARSAL": "1", "R1_SESSION_STATE": str(tmp_path / "state"),
        "R1_SESSION_RESERVE": str(reserve), "R1_SESSION_SHORTEST": str(shortest),
        "R1_VENV": sys.prefix,
    }  # fmt: skip
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_session.sh"), str(budget)],
        env=env, capture_output=True, text=True, timeout=budget + 120,
    )  # fmt: skip
    return done, out


@pytest.mark.slow
@pytest.mark.skipif(not distributed.deepspeed_installed(), reason="deepspeed is not installed")
def test_the_session_runs_every_step_and_leaves_each_log(tmp_path):
    done, out = session(tmp_path, budget=600, reserve=150)
    log = (out / "session.log").read_text()
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("gpu_tiny", "fused_head", "sft_engines"):
        assert f"{name}: done in" in log, log
    assert "rl_only_llama" in (out / "gpu_tiny.log").read_text()  # the flow's last stage
    head = (out / "fused_head.log").read_text()
    assert "sft  eager" in head and "grpo eager" in head
    phases = json.loads((out / "gpu_check.json").read_text())["shapes"]["tiny"]["phases"]
    names = {p["name"] for p in phases}
    assert {"sft 4x96 (zero-2 fused head)", "grpo (zero-2 fused head, ref)"} <= names, names
    assert all(p["ok"] for p in phases), [p["error"] for p in phases if not p["ok"]]


@pytest.mark.slow
def test_a_step_the_budget_cannot_hold_is_cut_and_said(tmp_path):
    """The flow given 8 s (its temporary Prefect server alone takes about 5): cut, said, and
    nothing of it left running."""
    import psutil

    done, out = session(tmp_path, budget=40, reserve=32, shortest=3)
    log = (out / "session.log").read_text()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "gpu_tiny: CUT at 8s" in log, log
    assert "finished in" in log, log
    left = []
    for process in psutil.process_iter():
        try:
            marked = any(k == "R1_SESSION_STEP" for k in process.environ())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if marked and str(tmp_path) in " ".join(process.cmdline()):
            left.append(process.cmdline())
    assert not left, left
