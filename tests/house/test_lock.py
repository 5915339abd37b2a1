"""The environment is the locked one: constraints/cpu.lock names every package the project needs
(its dependencies with the dev and cluster extras, followed to the bottom), and this environment
holds each at the locked version. scripts/setup.sh installs with the lock as its constraints, so a
fresh clone runs with the packages that gave the README's figures."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "constraints" / "cpu.lock"
PROJECT = "r1-pipeline"
EXTRAS = ("dev", "cluster")  # what scripts/setup.sh installs


def read_lock(text: str) -> dict[str, Version]:
    """Package name (canonical) -> pinned version; every line a `name==version` pin."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"not a pin: {line!r}"
        name = canonicalize_name(requirement.name)
        assert name not in pins, f"pinned twice: {requirement.name}"
        pins[name] = Version(spec.version)
    return pins


def needed(project: str, extras: tuple[str, ...]) -> set[str]:
    """Every distribution `project` with `extras` pulls in, through the installed metadata."""
    seen: set[str] = set()
    todo = [(project, extras)]
    while todo:
        name, wanted = todo.pop()
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker and not any(marker.evaluate({"extra": e}) for e in (*wanted, "")):
                continue
            key = canonicalize_name(requirement.name)
            if key not in seen or requirement.extras:
                seen.add(key)
                todo.append((requirement.name, tuple(requirement.extras)))
    return seen


def installed(name: str) -> Version:
    """The installed version without its local label (torch's +cpu)."""
    return Version(Version(metadata.version(name)).public)


def test_read_lock_reads_pins_and_refuses_ranges():
    assert read_lock("# head\nTorch==2.13.0  # cpu\n\nfoo_bar==1.0\n") == {
        "torch": Version("2.13.0"),
        "foo-bar": Version("1.0"),
    }
    with pytest.raises(AssertionError, match="not a pin"):
        read_lock("torch>=2.6\n")
    with pytest.raises(AssertionError, match="pinned twice"):
        read_lock("torch==2.13.0\nTORCH==2.13.0\n")


def test_the_lock_names_every_package_the_project_needs():
    pins = read_lock(LOCK.read_text())
    missing = needed(PROJECT, EXTRAS) - set(pins)
    assert not missing, f"not in {LOCK.name} (run scripts/lock.sh): {sorted(missing)}"


def test_every_package_the_project_needs_is_installed_at_its_locked_version():
    pins = read_lock(LOCK.read_text())
    wrong = {}
    for name in needed(PROJECT, EXTRAS) & set(pins):
        version = pins[name]
        try:
            found = installed(name)
        except metadata.PackageNotFoundError:
            found = None
        if found != version:
            wrong[name] = f"locked {version}, installed {found}"
    assert not wrong, f"this environment is not the locked one (bash scripts/setup.sh): {wrong}"
