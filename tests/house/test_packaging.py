"""The installed distribution holds every package the code imports, not only what the tests see."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_INSTALLED = {"tests", "benchmarks"}  # run from a checkout, not from the installed package


def test_every_top_level_package_is_listed_in_pyproject():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {p.parent.name for p in ROOT.glob("*/__init__.py")} - NOT_INSTALLED
    assert found - listed == set(), "packages missing from [tool.setuptools] packages"


def test_the_wheel_holds_the_data_and_inner_packages_and_setuptools_warns_of_nothing(tmp_path):
    """A real build (what `pip install .` makes): the example graders and the sandbox's inner
    programs are in it, and setuptools does not warn that a folder looks like a package left
    out (it did, 51 lines at every `scripts/setup.sh`)."""
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "source"  # setuptools builds in the tree: a copy, not the checkout
    left_out = shutil.ignore_patterns(
        ".*", "state", "build", "checkpoints", "data", "*.egg-info", "__pycache__"
    )
    shutil.copytree(ROOT, source, ignore=left_out)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
         "-v", "-w", str(tmp_path / "wheel")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    output = built.stdout + built.stderr
    assert "absent from the `packages` configuration" not in output, output[-5000:]
    (wheel,) = (tmp_path / "wheel").glob("r1_pipeline-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "graders/examples/exact_answer.yaml" in names
    assert {"sandbox/inner/launcher.py", "sandbox/inner/judge.py"} <= names
