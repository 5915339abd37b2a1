#!/usr/bin/env bash
# Main job: set up on first use, then run the R1 pipeline flow (default: the tiny profile).
# Extra arguments go to `r1 run`, e.g. --profile micro, --set evaluation.n_samples=8.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${R1_VENV:-.venv}/bin/r1" run "$@"
