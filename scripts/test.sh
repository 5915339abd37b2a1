#!/usr/bin/env bash
# Tests: set up on first use, then run the default (fast) suite, which includes the end-to-end
# pipeline test on the micro profile. Extra arguments go to pytest (e.g. -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser.sh  # Chromium for tests/operations/test_mlflow_ui.py; never fails, the test skips without it
# how torch's OpenMP threads wait is settled by tests/conftest.py before torch loads
# (host/threads.py): spinning while the CPUs are the tests' own, not while other work needs them
python="${R1_VENV:-.venv}/bin/python"
# Several workers (pytest-xdist), one a usable CPU, at most four: on 2 cores much of a test is a
# process starting, a server answering or a heartbeat waited out, and the other core runs the
# next test meanwhile. A module's tests stay on one worker (its fixtures are made once; the
# cluster tests' Ray cluster too: tests/conftest.py); a test marked `alone` runs with no other
# beside it (tests/workers.py). R1_TEST_WORKERS sets how many;
# 0 or 1 runs every test in this process.
workers="${R1_TEST_WORKERS:-$("$python" -c 'from host.threads import usable_cpus; print(min(4, usable_cpus()))')}"
case "$workers" in
  ''|*[!0-9]*) echo "test.sh: R1_TEST_WORKERS=$workers: expected a whole number of workers (0 runs in this process)" >&2; exit 2 ;;
esac
if [ "$workers" -le 1 ]; then workers=0; fi
exec "$python" -m pytest -n "$workers" --dist loadscope "$@"
