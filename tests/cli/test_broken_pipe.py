"""A reader that closes the pipe early (`r1 runs | head`, `r1 config | head`) ends the command
quietly, as Python's documentation of SIGPIPE recommends: no BrokenPipeError traceback."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_closed_pipe_ends_the_command_without_a_traceback(tmp_path):
    r1 = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "config", "--profile", "micro"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    r1.stdout.close()  # the reader is gone before the command prints a line
    _, err = r1.communicate(timeout=120)
    assert "BrokenPipeError" not in err and "Traceback" not in err, err
    assert r1.returncode == 1
