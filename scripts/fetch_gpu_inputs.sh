#!/usr/bin/env bash
# What configs/gpu-qwen.yaml reads, fetched on a machine with hub access (the pipeline itself
# never downloads): three checkpoints into checkpoints/, GSM8K as JSONL into data/gsm8k/.
#
#   bash scripts/fetch_gpu_inputs.sh           checkpoints and GSM8K
#   bash scripts/fetch_gpu_inputs.sh models    the checkpoints only
#   bash scripts/fetch_gpu_inputs.sh data      GSM8K only
#   bash scripts/fetch_gpu_inputs.sh math      MATH (problem/solution columns) into data/math/
#
# Llama 3.2 is gated: accept Meta's license on https://huggingface.co/meta-llama/Llama-3.2-1B-Instruct
# and log in (`hf auth login`) first. Settings: R1_VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${R1_VENV:-.venv}"
export HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 TRANSFORMERS_OFFLINE=0  # this script is online

models() {
  for repo in Qwen/Qwen2.5-1.5B-Instruct Qwen/Qwen2.5-0.5B-Instruct meta-llama/Llama-3.2-1B-Instruct; do
    # Llama's original/ holds Meta's own copy of the weights, unused here
    "$venv/bin/hf" download "$repo" --local-dir "checkpoints/${repo#*/}" --exclude "original/*"
  done
}

# Each split of a hub data set as one JSONL file: export DATASET CONFIG FOLDER SPLIT...
export_jsonl() {
  mkdir -p "$3"
  "$venv/bin/python" - "$@" <<'EOF'
import sys

from datasets import load_dataset

name, config, folder, *splits = sys.argv[1:]
data = load_dataset(name, None if config == "-" else config)
for split in splits:
    data[split].to_json(f"{folder}/{split}.jsonl", lines=True, force_ascii=False)
    print(f"{folder}/{split}.jsonl: {len(data[split])} rows")
EOF
}

case "${1:-all}" in
  models) models ;;
  data) export_jsonl openai/gsm8k main data/gsm8k train test ;;
  math) export_jsonl DigitalLearningGmbH/MATH-lighteval - data/math train test ;;
  all) models; export_jsonl openai/gsm8k main data/gsm8k train test ;;
  *) echo "usage: bash scripts/fetch_gpu_inputs.sh [all|models|data|math]" >&2; exit 2 ;;
esac
