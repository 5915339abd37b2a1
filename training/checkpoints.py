"""Training checkpoints: one `last` state per run folder, swapped in atomically, tied to its run
by a fingerprint so a folder never resumes somebody else's run."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch

log = logging.getLogger(__name__)


def save_checkpoint(ckpt_dir: Path, state: dict) -> None:
    """Write to a scratch folder, then swap it in: a process killed at any point leaves a whole
    checkpoint (`last`, or `last.old` between the two renames) that `load_checkpoint` finds."""
    tmp, last, old = ckpt_dir / "last.tmp", ckpt_dir / "last", ckpt_dir / "last.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(state, tmp / "state.pt")
    if last.exists():
        shutil.rmtree(old, ignore_errors=True)  # left by a kill before its removal finished
        last.rename(old)
    tmp.rename(last)
    shutil.rmtree(old, ignore_errors=True)


def checkpoint_file(ckpt_dir: Path) -> Path | None:
    """The state file to resume from: `last`, or `last.old` when the process died between the
    two renames of `save_checkpoint` (then `last` is missing and `last.old` is whole)."""
    for name in ("last", "last.old"):
        path = ckpt_dir / name / "state.pt"
        if path.exists():
            return path
    return None


def load_checkpoint(ckpt_dir: Path, fingerprint: str) -> dict | None:
    path = checkpoint_file(ckpt_dir)
    if path is None:
        return None
    state = torch.load(path, weights_only=False)
    if state.get("fingerprint") != fingerprint:
        log.warning("ignoring checkpoint at %s: it belongs to a different run", path.parent)
        return None
    return state
