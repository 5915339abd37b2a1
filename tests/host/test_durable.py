"""What is swapped in, or named by a stage's result, is on disk first (host/durable.py): a
machine that goes down leaves a whole checkpoint. A power cut cannot be made here; these tests
watch the order of the system calls instead: every file of a checkpoint synced before the rename
that swaps it in, the folder holding the rename synced after it, a saved model's files synced
before `save_model` returns."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from host.durable import sync_folder, sync_tree
from models.saved import save_model
from tests.tiny_models import make_tokenizer, tiny_model
from training.checkpoints import load_checkpoint, save_checkpoint


@pytest.fixture
def calls(monkeypatch) -> list[tuple[str, str]]:
    """("sync", path) for each fsync and ("rename", destination) for each Path.rename, in
    order, the real calls made all the same."""
    seen: list[tuple[str, str]] = []
    fsync, rename = os.fsync, Path.rename

    def watched_fsync(fd: int) -> None:
        seen.append(("sync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def watched_rename(self: Path, target):
        seen.append(("rename", str(target)))
        return rename(self, target)

    monkeypatch.setattr(os, "fsync", watched_fsync)
    monkeypatch.setattr(Path, "rename", watched_rename)
    return seen


def test_a_checkpoint_is_on_disk_before_it_is_swapped_in_and_the_swap_after(tmp_path, calls):
    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, {"step": 1, "fingerprint": "f", "w": torch.ones(4)})
    save_checkpoint(ckpt, {"step": 2, "fingerprint": "f", "w": torch.zeros(4)})

    second = calls[calls.index(("rename", str(ckpt / "last"))) + 1 :]
    swap = second.index(("rename", str(ckpt / "last")))
    before, after = second[:swap], second[swap + 1 :]
    assert ("sync", str(ckpt / "last.tmp" / "state.pt")) in before, second
    assert ("sync", str(ckpt / "last.tmp")) in before, second
    assert ("sync", str(ckpt)) in after, second
    assert load_checkpoint(ckpt, "f")["step"] == 2


def test_a_saved_models_files_are_on_disk_when_it_is_named(tmp_path, calls):
    tokenizer = make_tokenizer()
    ref = save_model(tiny_model(tokenizer), tokenizer, tmp_path / "stage")
    synced = {path for kind, path in calls if kind == "sync"}
    files = {str(path) for path in ref.path.rglob("*") if path.is_file()}
    assert files and files <= synced, files - synced
    assert {str(ref.path), str(tmp_path / "stage")} <= synced


def test_a_tree_is_synced_files_first_then_folders_deepest_first(tmp_path, calls):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x").write_text("x")
    (tmp_path / "a" / "y").write_text("y")
    sync_tree(tmp_path / "a")
    order = [path for kind, path in calls if kind == "sync"]
    a, b = str(tmp_path / "a"), str(tmp_path / "a" / "b")
    assert sorted(order[:2]) == [str(tmp_path / "a" / "b" / "x"), str(tmp_path / "a" / "y")]
    assert order[2:] == [b, a]


def test_a_folder_its_file_system_cannot_sync_is_passed_over(tmp_path, monkeypatch):
    def refused(fd: int) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "fsync", refused)
    sync_folder(tmp_path)  # no error: such a file system keeps no folder to sync
    (tmp_path / "f").write_text("f")
    with pytest.raises(OSError):  # a file that cannot be synced is no checkpoint on disk
        sync_tree(tmp_path)
