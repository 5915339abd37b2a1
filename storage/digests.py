"""Content digests: the identity of data and models in lineage and cache keys."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

_CHUNK = 1 << 20


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


HUB_CACHE = ".cache/"  # `hf download --local-dir` keeps download metadata (with times) here


def tree_digest(root: Path, skip: Iterable[str] = ()) -> str:
    """Digest over a folder's files (relative names and bytes), in name order; files are read
    in chunks, so a checkpoint of many GB costs time, not memory. A hub download's `.cache/`
    is bookkeeping, not content: two downloads of the same files digest the same."""
    skipped = set(skip)
    h = hashlib.sha256()
    for path in tree_files(root):
        rel = path.relative_to(root).as_posix()
        if rel in skipped or rel.startswith(HUB_CACHE):
            continue
        h.update(rel.encode())
        h.update(file_digest(path).encode())
    return h.hexdigest()


def tree_files(root: Path) -> list[Path]:
    """Every file under `root`, in name order, through folders that are symlinks too (a
    checkpoint put together from links to other folders), each real folder once (a link back up
    the tree ends there)."""
    found: list[Path] = []
    seen: set[str] = set()
    for folder, subfolders, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            subfolders.clear()
            continue
        seen.add(real)
        subfolders.sort()  # the same folder reached twice: the first name in order counts
        found += [Path(folder, name) for name in files if Path(folder, name).is_file()]
    return sorted(found)


def rows_digest(rows: Iterable[dict]) -> str:
    """Digest over rows' content, independent of how they are stored on disk."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()
