"""Run model-written Python in a local sandbox (the code reward's executor)."""

from sandbox.limits import Limits, SandboxResult
from sandbox.runner import capabilities, run_python

__all__ = ["Limits", "SandboxResult", "capabilities", "run_python"]
