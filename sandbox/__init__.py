"""Run model-written Python in a local sandbox (the code reward's executor).

Names load on first use, so that the sandbox's own processes, which import `sandbox.inner`,
do not import the host-side runner.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Limits": "sandbox.limits",
    "SandboxResult": "sandbox.limits",
    "Verdict": "sandbox.limits",
    "Job": "sandbox.runner",
    "capabilities": "sandbox.runner",
    "run_jobs": "sandbox.runner",
    "run_python": "sandbox.runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
