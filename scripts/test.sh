#!/usr/bin/env bash
# Tests: set up on first use, then run the default (fast) suite, which includes the end-to-end
# pipeline test on the micro profile. Extra arguments go to pytest (e.g. -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser.sh  # Chromium for tests/operations/test_mlflow_ui.py; never fails, the test skips without it
# torch's OpenMP threads sleep after a short spin (host/threads.py): set before anything loads
# torch, unless the caller chose how they wait
if [ -z "${OMP_WAIT_POLICY:-}${GOMP_SPINCOUNT:-}" ]; then
  export OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=1000
fi
exec "${R1_VENV:-.venv}/bin/python" -m pytest "$@"
