"""The host directories a session's private root is made of: the interpreter's, bound read-only,
and every third-party package directory, covered by an empty one."""

from __future__ import annotations

import glob
import os
import site
import sys


def interpreter_dirs(python: str) -> list[str]:
    """Host directories the session's interpreter (`python`) needs, bound read-only into the
    root."""
    dirs = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    dirs.add(os.path.dirname(os.path.dirname(python)))
    return sorted(d for d in dirs if d not in ("/", "") and not d.startswith("/usr/"))


def site_packages_dirs() -> list[str]:
    """Directories of third-party packages the programs must not import from: each is covered by
    an empty read-only directory in the private root."""
    found = set(site.getsitepackages([sys.base_prefix, sys.base_exec_prefix]))
    for pattern in ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages",
                    "/usr/lib/python3/dist-packages"):  # fmt: skip
        found.update(glob.glob(pattern))
    return sorted(os.path.realpath(p) for p in found if os.path.isdir(p))
