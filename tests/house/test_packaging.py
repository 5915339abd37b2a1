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
