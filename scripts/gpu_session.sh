#!/usr/bin/env bash
# A lent GPU's session in one call, within a budget of seconds (default 540: a device call may
# run 600), every log under $OUT (else ./gpu_session). Build the kit here first (network):
# `bash scripts/gpu_kit.sh`, then carry .whl/ to the device and run `bash scripts/gpu_session.sh`.
#   1. the kit installed into $KIT_SITE and checked, a small flow (scripts/gpu_kit.sh device)
#   2. the gpu-tiny profile end to end (`r1 run --profile gpu-tiny`), its per-stage table at 180
#      columns; cut, and said so, when only the reserve for steps 3-4 is left
#   3. the head's chunks eager and fused at the 0.5B micro-batch (benchmarks/fused_head.py)
#   4. SFT under ZeRO-2, with the fused head, without DeepSpeed's overflow scan, under ZeRO-1's
#      BF16_Optimizer and on one process's mixed engine, beside the plain loop, and GRPO steps
#      on each ZeRO setting, at the 0.5B shape (benchmarks/gpu_check.py --zero-stage 2 1
#      --phases sft peer mixed grpo --fused-head --no-overflow-scan)
# Each step runs under `timeout` of what the budget has left; a step cut or failed is said in
# session.log and the next one starts. A CPU rehearsal of the whole sequence, small:
#   R1_SESSION_REHEARSAL=1 bash scripts/gpu_session.sh 600
set -uo pipefail
cd "$(dirname "$0")/.."

budget="${1:-540}"
out="${OUT:-gpu_session}"
reserve="${R1_SESSION_RESERVE:-150}"  # seconds kept for steps 3 and 4
shortest="${R1_SESSION_SHORTEST:-20}"  # a step given less than this is skipped
python="${PYTHON:-python3}"
state="${R1_SESSION_STATE:-/tmp/r1-gpu-tiny}"
mkdir -p "$out"
start=$(date +%s)
export PYTHONUNBUFFERED=1 COLUMNS=180 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

say() { echo "gpu_session: $*" | tee -a "$out/session.log" >&2; }
left() { echo $((budget - ($(date +%s) - start))); }

# left_behind NAME MARKER: processes a step left running, found by the marker in their
# environment (a step's processes inherit it, also those in a session of their own, such as a
# stage's DeepSpeed workers, which the step's end does not reach), killed and said: the next
# step measures on a device no one else holds.
left_behind() {
  local pids
  pids=$(grep -lszFx -- "$2" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | tr '\n' ' ' || true)
  if [ -n "${pids// /}" ]; then
    say "$1: killed what it left running: ${pids% }"
    # shellcheck disable=SC2086
    kill -9 $pids 2> /dev/null || true
  fi
}

# step NAME SECONDS COMMAND...: COMMAND under `timeout SECONDS` (at most what is left; then
# SIGTERM, and SIGKILL 30 s later), its output in $out/NAME.log, its ending and wall time said,
# anything it left running killed.
step() {
  local name="$1" limit="$2"
  shift 2
  local remaining
  remaining=$(left)
  if [ "$limit" -gt "$remaining" ]; then limit="$remaining"; fi
  if [ "$limit" -lt "$shortest" ]; then
    say "$name: skipped, ${remaining}s of the budget left"
    return 0
  fi
  local t0 rc marker="R1_SESSION_STEP=$name.$$"
  t0=$(date +%s)
  say "$name: starting (at most ${limit}s)"
  timeout --kill-after=30 "$limit" env "$marker" "$@" > "$out/$name.log" 2>&1
  rc=$?
  left_behind "$name" "$marker"
  case "$rc" in
    0) say "$name: done in $(($(date +%s) - t0))s" ;;
    124 | 137) say "$name: CUT at ${limit}s (the budget); its log: $out/$name.log" ;;
    *) say "$name: FAILED (exit $rc) after $(($(date +%s) - t0))s; its log: $out/$name.log" ;;
  esac
  return 0
}

if [ -n "${R1_SESSION_REHEARSAL:-}" ]; then  # the sequence on CPU, every size cut
  python="${R1_VENV:-.venv}/bin/python"
  profile=(--profile micro)
  head=(--device cpu --positions 256 --vocab 4096 --repeats 2)
  export DS_ACCELERATOR=cpu
  check=(--device cpu --shape tiny --sft-steps 1 --sft-shapes 4x96 --micro-batch-tokens 200
         --logits-chunk-mb 0.2 --max-new-tokens 16 --grpo-steps 1 --grpo-prompts 2 --group 4)
else
  if [ ! -d .whl ]; then
    say "no .whl/ here: build the kit first (bash scripts/gpu_kit.sh) and carry it"
    exit 2
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$out/session.log"
  step kit 120 env PYTHON="$python" bash scripts/gpu_kit.sh device
  export PYTHONPATH="${KIT_SITE:-/tmp/r1-site}${PYTHONPATH:+:$PYTHONPATH}"
  profile=(--profile gpu-tiny)
  head=(--device cuda --positions 16384 --hidden 896 --vocab 151936 --dtype bf16
        --chunk-mb 1024)
  check=(--shape qwen2.5-0.5b --sft-shapes 32x512 --sft-steps 3)
fi

rm -rf "$state"
step gpu_tiny $(($(left) - reserve)) "$python" -m cli.main run "${profile[@]}" --state-dir "$state"
step fused_head 60 "$python" -m benchmarks.fused_head "${head[@]}"
step sft_engines 600 "$python" -m benchmarks.gpu_check "${check[@]}" --zero-stage 2 1 \
  --phases sft peer mixed grpo --fused-head --no-overflow-scan --no-attention \
  --out "$out/gpu_check.json"
say "finished in $(($(date +%s) - start))s of ${budget}s"
