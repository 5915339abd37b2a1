"""Content digests of folders: a checkpoint put together from symlinked folders is digested by
what the links reach, and a link back up the tree ends the walk."""

from __future__ import annotations

import os
from pathlib import Path

from storage.digests import tree_digest, tree_files
from tasks.stage_cache import content_digest


def checkpoint(root: Path) -> Path:
    """A model folder whose tokenizer folder is a link to a folder elsewhere."""
    shared = root / "shared-tokenizer"
    shared.mkdir()
    (shared / "tokenizer.json").write_text('{"v": 1}')
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer").symlink_to(shared, target_is_directory=True)
    return model


def test_a_folder_reached_through_a_symlink_is_part_of_the_digest(tmp_path):
    model = checkpoint(tmp_path)
    assert [p.relative_to(model).as_posix() for p in tree_files(model)] == [
        "config.json",
        "tokenizer/tokenizer.json",
    ]
    before, keyed = tree_digest(model), content_digest(model)
    (tmp_path / "shared-tokenizer" / "tokenizer.json").write_text('{"v": 2}')
    assert tree_digest(model) != before
    assert content_digest(model) != keyed


def test_a_link_back_up_the_tree_ends_the_walk(tmp_path):
    model = checkpoint(tmp_path)
    os.symlink(model, model / "loop", target_is_directory=True)
    assert [p.relative_to(model).as_posix() for p in tree_files(model)] == [
        "config.json",
        "tokenizer/tokenizer.json",
    ]


def test_a_plain_folder_digests_as_before(tmp_path):
    """No links: the files in name order, as the digest always read them."""
    folder = tmp_path / "plain"
    (folder / "b").mkdir(parents=True)
    (folder / "a.txt").write_text("a")
    (folder / "b" / "c.txt").write_text("c")
    assert tree_files(folder) == sorted(p for p in folder.rglob("*") if p.is_file())
