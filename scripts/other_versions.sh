#!/usr/bin/env bash
# The GPU-facing tests on CPU under another torch and transformers than the lock's: the versions a
# GPU machine runs (its image's, or what the `gpu` extra's vLLM pins), checked here before device
# time is spent on them. A virtual environment of its own (the lock's versions but these three;
# torch from the package index, the CUDA build where that is its default: it runs on a machine
# without a GPU, and about 6 GB with its CUDA libraries), then the tests that sample, train, run
# GRPO, check the GPU benchmarks and run the gpu profiles cut (slow ones included).
#
#   bash scripts/other_versions.sh 2.11.0 5.17.0 1.33.0   # the device machine's (docs/gpu.md)
#   bash scripts/other_versions.sh 2.14.0 5.20.2          # what vLLM 0.33's pins allow
#
# Settings: VENV_DIR (/tmp/r1-torch-TORCH-transformers-TRANSFORMERS), PYTHON (python3). Extra
# arguments after the versions go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
  echo "usage: bash scripts/other_versions.sh TORCH TRANSFORMERS [HUGGINGFACE_HUB] [pytest args]" >&2
  exit 2
fi
torch_version="$1" transformers_version="$2"
shift 2
hub_version=""
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9][0-9.]*$ ]]; then hub_version="$1"; shift; fi

venv="${VENV_DIR:-/tmp/r1-torch-$torch_version-transformers-$transformers_version}"
constraints="$venv.constraints.txt"
# setuptools is left free: an older torch caps it below the lock's
sed -e "s/^torch==.*/torch==$torch_version/" \
    -e "s/^transformers==.*/transformers==$transformers_version/" \
    -e '/^setuptools==/d' constraints/cpu.lock > "$constraints"
if [ -n "$hub_version" ]; then
  sed -i "s/^huggingface_hub==.*/huggingface_hub==$hub_version/" "$constraints"
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "other_versions: creating $venv (torch $torch_version, transformers $transformers_version)" >&2
  "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
fi
"$venv/bin/python" -m pip install -qq -c "$constraints" -e ".[dev]"
"$venv/bin/python" -c 'import torch, transformers, huggingface_hub as h
print(f"other_versions: torch {torch.__version__}, transformers {transformers.__version__}, huggingface_hub {h.__version__}")'

workers="$("$venv/bin/python" -c 'from host.threads import usable_cpus; print(min(4, usable_cpus()))')"
if [ "$workers" -le 1 ]; then workers=0; fi
# the GPU-marked tests skip here by their own checks; the cluster ones need Ray, not installed
exec "$venv/bin/python" -m pytest -n "$workers" --dist loadscope -m "not cluster" \
  tests/sampling tests/training tests/rl tests/benchmarks tests/models tests/tasks \
  tests/pipeline/test_gpu_tiny.py tests/pipeline/test_gpu_profile.py \
  tests/pipeline/test_pipeline_e2e.py "$@"
