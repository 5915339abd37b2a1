"""`r1` from a shell whose `PYTHONPATH` names another project with packages called as ours
(`configs`, `training`, `models`, ...): r1 runs on its own packages, and says so."""

import os
import subprocess
import sys
from pathlib import Path

from cli.import_path import project_packages, shadowing

REPO = Path(__file__).resolve().parents[2]


def other_project(root: Path) -> Path:
    """A project of its own with a `configs` package and a `schema` module in it, as many have."""
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "__init__.py").write_text("")
    (root / "configs" / "schema.py").write_text("class Settings:\n    pass\n")
    (root / "helpers.py").write_text("")  # a name the project does not use
    return root


def test_r1_runs_on_its_own_packages_with_another_projects_on_pythonpath(tmp_path):
    other = other_project(tmp_path / "other")
    r1 = Path(sys.executable).with_name("r1")  # the console script, as scripts/run.sh runs it
    ran = subprocess.run(
        [str(r1), "config", "--profile", "micro", "--state-dir", str(tmp_path / "state")],
        cwd=tmp_path, env=os.environ | {"PYTHONPATH": f"{other}{os.pathsep}{REPO}"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "name: r1-micro" in ran.stdout
    assert ran.stderr == (
        f"r1: {other / 'configs'} on the import path (PYTHONPATH) share names with this "
        f"project's packages; r1 uses its own, from {REPO}\n"
    )


def test_only_folders_ahead_of_the_project_and_only_its_names_are_in_the_way(tmp_path):
    other = other_project(tmp_path / "other")
    assert {"cli", "configs", "models", "training"} <= set(project_packages(REPO))
    assert shadowing([str(other), str(REPO)], REPO) == {"configs": other}
    assert shadowing([str(REPO), str(other)], REPO) == {}
    assert shadowing([str(tmp_path), str(REPO)], REPO) == {}  # no package of ours there
