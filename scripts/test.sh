#!/usr/bin/env bash
# Tests: set up on first use, then run the default (fast) suite, which includes the end-to-end
# pipeline test on the micro profile. Extra arguments go to pytest (e.g. -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser.sh  # Chromium for tests/operations/test_mlflow_ui.py; never fails, the test skips without it
# how torch's OpenMP threads wait is settled by tests/conftest.py before torch loads
# (host/threads.py): spinning while the CPUs are the tests' own, not while other work needs them
exec "${R1_VENV:-.venv}/bin/python" -m pytest "$@"
