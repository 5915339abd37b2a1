"""Training checkpoints: one `last` state per run folder, swapped in atomically, tied to its run
by a fingerprint so a folder never resumes somebody else's run."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch

from host.durable import sync_folder, sync_tree
from storage.disk import (
    NEARLY_FULL,
    StateDiskError,
    cause_text,
    disk_error,
    disk_space,
    full_disk_message,
)

log = logging.getLogger(__name__)


def save_checkpoint(ckpt_dir: Path, state: dict) -> None:
    """Write to a scratch folder, then swap it in: a process killed at any point leaves a whole
    checkpoint (`last`, or `last.old` between the two renames) that `load_checkpoint` finds. The
    new one is on disk before the swap, and the swap after it (host/durable.py): a machine
    that goes down leaves one whole checkpoint too."""
    tmp, last, old = ckpt_dir / "last.tmp", ckpt_dir / "last", ckpt_dir / "last.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        torch.save(state, tmp / "state.pt")
        sync_tree(tmp)
    except (OSError, RuntimeError) as error:
        shutil.rmtree(tmp, ignore_errors=True)  # the part written: `last` stays the checkpoint
        told = unsaved_checkpoint_error(error, ckpt_dir, state_bytes(state))
        if told is None:
            raise
        raise told from error
    if last.exists():
        shutil.rmtree(old, ignore_errors=True)  # left by a kill before its removal finished
        last.rename(old)
    tmp.rename(last)
    sync_folder(ckpt_dir)
    shutil.rmtree(old, ignore_errors=True)


def state_bytes(state: object) -> int:
    """The bytes of the tensors in a checkpoint's state (nested in dicts, lists and tuples): about
    what `torch.save` writes of it."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(value) for value in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(value) for value in state)
    return 0


def unsaved_checkpoint_error(
    error: BaseException, ckpt_dir: Path, needed: int
) -> StateDiskError | None:
    """A checkpoint that could not be written for want of space, in one line naming its folder,
    the free space and about what it needs. `torch.save` on a full disk says only `unexpected
    pos 576 vs 534` (a RuntimeError), so the disk is taken for full also when it has less room
    than the checkpoint needs. None for any other failure."""
    last = checkpoint_file(ckpt_dir)
    kept = f"the last one, {last.parent}, is kept" if last else "none was saved before"
    who = f"saving a checkpoint ({kept})"
    told = disk_error(error, ckpt_dir, who, needed)
    if told is not None:
        return told
    space = disk_space(ckpt_dir)
    if space is None or space.free >= needed + NEARLY_FULL:
        return None
    return StateDiskError(
        f"{full_disk_message(who, ckpt_dir, space, needed)} ({cause_text(error)})"
    )


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
