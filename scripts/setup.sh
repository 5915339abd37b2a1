#!/usr/bin/env bash
# Creates .venv (if missing) and installs the project with its dev tools and the cluster extra
# (Ray, which the cluster tests start on loopback), CPU-only.
# Every package at the version in constraints/cpu.lock (scripts/lock.sh writes it), so that a fresh
# clone runs with the packages that gave the README's figures.
# Re-running is cheap: it reinstalls only when pyproject.toml or the lock change.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${R1_VENV:-.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv with $("$python" --version)" >&2
  "$python" -m venv "$venv"
fi

stamp="$venv/.r1-install-stamp"
wanted="$(cat pyproject.toml constraints/cpu.lock | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
  echo "setup: installing the project into $venv (CPU build of torch; first time takes a few minutes)" >&2
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  # -qq: errors only; setuptools otherwise prints its notice about editable installs each time
  "$venv/bin/python" -m pip install -qq -c constraints/cpu.lock -e ".[dev,cluster]"
  echo "$wanted" > "$stamp"
fi

# A migrated empty Prefect database, once per Prefect version: a new state folder starts from a
# copy of it instead of running Prefect's migrations (cli/prefect_server.py). Optional.
"$venv/bin/python" -m cli.prefect_server > /dev/null \
  || echo "setup: no Prefect database template; each new state folder migrates its own" >&2
