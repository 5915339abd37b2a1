"""The project's own packages before any of the same name on `PYTHONPATH`.

`r1` is a console script: Python puts its folder (`.venv/bin`) first on the import path, then
each folder of `PYTHONPATH`, and finds the project's packages last, through the editable
install's finder. A shell set up for another project (`PYTHONPATH=~/code/other`) whose folder
holds a package named as one of ours (`training`, `models`, `configs`, `evaluation`, `tasks`,
`storage`, ...) gave `r1` that package: `ImportError: cannot import name 'PROGRESS' from
'training' (.../other/training/__init__.py)` once the run had started, or, where a module's
name matched too, the other project's code in the run.

This module imports nothing of the project, so that it can run before any of it is imported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]


def project_packages(project: Path = PROJECT) -> list[str]:
    """The project's top-level packages: its folders with an `__init__.py`."""
    return sorted(p.parent.name for p in project.glob("*/__init__.py"))


def provides(folder: Path, name: str) -> bool:
    """Whether `folder` on the import path gives a module or regular package called `name`."""
    return (folder / name / "__init__.py").is_file() or (folder / f"{name}.py").is_file()


def shadowing(path: list[str], project: Path = PROJECT) -> dict[str, Path]:
    """Each package of the project that a folder on `path` ahead of the project's own gives
    under the same name, with that folder (the first one)."""
    found: dict[str, Path] = {}
    names = project_packages(project)
    for entry in path:
        folder = Path(entry or ".").resolve()
        if folder == project:
            break  # the project's own folder comes first from here on
        if not folder.is_dir():
            continue
        for name in names:
            if name not in found and provides(folder, name):
                found[name] = folder
    return found


def imported_from_elsewhere(name: str, project: Path = PROJECT) -> list[str]:
    """The modules already imported as `name` or its submodules from outside the project."""
    return [
        module
        for module, loaded in list(sys.modules.items())
        if (module == name or module.startswith(f"{name}."))
        and getattr(loaded, "__file__", None)
        and not Path(loaded.__file__).resolve().is_relative_to(project)
    ]


def project_first(project: Path = PROJECT) -> str | None:
    """Where a folder on the import path ahead of the project gives a package named as one of
    the project's: put the project's folder first, for this process (forgetting what was
    imported from the other folder) and, through `PYTHONPATH`, for the processes it starts.
    Returns the line that says so, None where nothing was in the way."""
    found = shadowing(sys.path, project)
    if not found:
        return None
    sys.path.insert(0, str(project))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(project), os.environ.get("PYTHONPATH", "")])
    )
    for name in found:
        for module in imported_from_elsewhere(name, project):
            del sys.modules[module]
    named = ", ".join(str(folder / name) for name, folder in found.items())
    return (
        f"r1: {named} on the import path (PYTHONPATH) share names with this project's "
        f"packages; r1 uses its own, from {project}"
    )
