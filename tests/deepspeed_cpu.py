"""DeepSpeed on the CPU in a Python process of its own: it needs a torch.distributed group and
keeps module-level state, so tests run it apart from pytest's workers, on one thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_python(
    args: list[str], cwd: Path = ROOT, timeout: int = 600
) -> subprocess.CompletedProcess:
    """`python ARGS` with the CPU accelerator, the repository importable, one OpenMP thread."""
    env = os.environ | {"DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def driver_result(module: str, *args: str, timeout: int = 600) -> dict:
    """What `python -m MODULE ARGS` printed last as `RESULT <json>`; fails with its output if it
    exited otherwise than 0 or printed none."""
    done = run_python(["-m", module, *args], timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))
