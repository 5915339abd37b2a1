#!/usr/bin/env bash
# Writes constraints/cpu.lock: every package `scripts/setup.sh` installs, at the version installed
# today, resolved in a new throwaway virtual environment from pyproject.toml and the direct pins
# of constraints/cpu.txt. setup.sh installs exactly the lock; run this on purpose to move to newer
# packages, then run the tests and the main job and commit the lock with the figures it gives.
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$python" -m venv "$work/venv"
echo "lock: resolving pyproject.toml with constraints/cpu.txt in a new environment" >&2
"$work/venv/bin/python" -m pip install -qq -c constraints/cpu.txt -e ".[dev,cluster]"
{
  echo "# Every package scripts/setup.sh installs (written by scripts/lock.sh, $("$python" --version),"
  echo "# $(uname -m)); setup.sh installs exactly these. torch without its local label (+cpu):"
  echo "# the CPU wheel where one is offered, as constraints/cpu.txt says. pip itself is not pinned."
  "$work/venv/bin/python" -m pip freeze --all --exclude-editable | grep -v "^pip==" | sed -E 's/^(torch==[^+]+)\+.*/\1/'
} > constraints/cpu.lock
echo "lock: wrote constraints/cpu.lock ($(grep -vc '^#' constraints/cpu.lock) packages)" >&2
