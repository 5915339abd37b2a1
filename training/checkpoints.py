"""Training checkpoints: one `last` state per run folder, swapped in atomically, tied to its run
by a fingerprint so a folder never resumes somebody else's run."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch

log = logging.getLogger(__name__)


def save_checkpoint(ckpt_dir: Path, state: dict) -> None:
    """Write to a scratch folder, then swap it in: a crash mid-write keeps the previous one."""
    tmp, last, old = ckpt_dir / "last.tmp", ckpt_dir / "last", ckpt_dir / "last.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(state, tmp / "state.pt")
    if last.exists():
        last.rename(old)
    tmp.rename(last)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(ckpt_dir: Path, fingerprint: str) -> dict | None:
    path = ckpt_dir / "last" / "state.pt"
    if not path.exists():
        return None
    state = torch.load(path, weights_only=False)
    if state.get("fingerprint") != fingerprint:
        log.warning("ignoring checkpoint at %s: it belongs to a different run", path.parent)
        return None
    return state
