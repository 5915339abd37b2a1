#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): SFT and GRPO steps under DeepSpeed ZeRO-2 in bf16 and
# the HF sampler on CUDA, on a model of Qwen2.5-0.5B's shape with random weights, against the
# memory model. For a GPU machine with no network: wheels in .whl/ (deepspeed, pydantic,
# math-verify and what they need, docs/gpu.md) are installed into a private folder first.
# Extra arguments go to the check; results go to $OUT (or here) as gpu_check.json and .log.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}"
python="${PYTHON:-python3}"
if [ -d .whl ]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/r1-site .whl/*.whl
  export PYTHONPATH="/tmp/r1-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$python" -m benchmarks.gpu_check --out "$out/gpu_check.json" "$@" 2>&1 | tee "$out/gpu_check.log"
