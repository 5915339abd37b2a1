"""The house's rules, checked in the test command: the import layers declared in pyproject.toml
hold (no package imports one above it, no module cycle inside a package), and no library file
grows past 500 lines."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 500


def library_packages() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [name for name in config["tool"]["setuptools"]["packages"] if "." not in name]


def test_every_library_package_is_in_the_import_contracts():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layered = {
        room.strip() for layer in config["contracts"][0]["layers"] for room in layer.split("|")
    }
    assert set(library_packages()) == set(config["root_packages"]) == layered


def test_the_import_layers_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_no_library_file_is_over_500_lines():
    long = [
        f"{path.relative_to(REPO)}: {n}"
        for package in library_packages()
        for path in sorted((REPO / package).rglob("*.py"))
        if (n := path.read_text().count("\n")) > MAX_LINES
    ]
    assert not long, long
