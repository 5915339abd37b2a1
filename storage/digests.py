"""Content digests: the identity of data and models in lineage and cache keys."""

from __future__ import annotations

import hashlib
import json
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
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel in skipped or rel.startswith(HUB_CACHE):
            continue
        h.update(rel.encode())
        h.update(file_digest(path).encode())
    return h.hexdigest()


def rows_digest(rows: Iterable[dict]) -> str:
    """Digest over rows' content, independent of how they are stored on disk."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()
