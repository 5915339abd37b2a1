#!/usr/bin/env bash
# Operations on one machine: a local Prefect server and a process worker on loopback, with their
# state in the project's state folder, and every deployment of prefect.yaml registered.
#
#   bash scripts/serve.sh          start server + worker (if not running) and deploy
#   bash scripts/serve.sh stop     stop both
#   bash scripts/serve.sh status   show what runs
#
# Then, in any shell:
#   export PREFECT_API_URL=http://127.0.0.1:4200/api
#   .venv/bin/prefect deployment run 'r1-pipeline/tiny' --watch
#
# Settings: R1_STATE_DIR (default ./state), R1_PREFECT_PORT (default 4200), R1_WORK_POOL
# (default r1-local), R1_VENV (default .venv).
#
# The pool r1-gpu is created but gets no worker here: `prefect deploy --all` refuses a
# deployment whose pool does not exist, and the runs of r1-pipeline/gpu wait in it for a worker
# on a GPU machine (README, "GPU profile").
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${R1_VENV:-.venv}"
port="${R1_PREFECT_PORT:-4200}"
pool="${R1_WORK_POOL:-r1-local}"
gpu_pool=r1-gpu  # prefect.yaml names it
cluster_pool=r1-cluster  # and this one: a worker on a machine of a Ray cluster (docs/cluster.md)
state="$(realpath -m "${R1_STATE_DIR:-state}")"
logs="$state/logs"
pids="$state/pids"

export R1_STATE_DIR="$state"
export PREFECT_HOME="$state/prefect"
export PREFECT_API_URL="http://127.0.0.1:$port/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_SERVER_API_HOST=127.0.0.1
export MLFLOW_TRACKING_URI="sqlite:///$state/mlflow.db"
export MLFLOW_SKIP_PIP_REQUIREMENTS_CHECK=true
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

running() { [ -f "$pids/$1" ] && kill -0 "$(cat "$pids/$1")" 2>/dev/null; }

stop() {
  for name in worker server; do
    if running "$name"; then
      pid="$(cat "$pids/$name")"
      kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      # a worker busy with a flow run may not stop on SIGTERM within 10 s
      kill -0 "$pid" 2>/dev/null && { kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null || true; }
      echo "serve: stopped the $name"
    fi
    rm -f "$pids/$name"
  done
}

status() {
  for name in server worker; do
    if running "$name"; then echo "$name: running (pid $(cat "$pids/$name"))"
    else echo "$name: stopped"; fi
  done
  echo "API: $PREFECT_API_URL   UI: http://127.0.0.1:$port   state: $state"
}

start() {
  bash scripts/setup.sh
  mkdir -p "$logs" "$pids" "$PREFECT_HOME"
  if ! running server; then
    setsid "$venv/bin/prefect" server start --host 127.0.0.1 --port "$port" \
      > "$logs/prefect-server.log" 2>&1 &
    echo $! > "$pids/server"
    echo "serve: Prefect server starting on 127.0.0.1:$port (log: $logs/prefect-server.log)"
  fi
  for _ in $(seq 1 120); do
    if "$venv/bin/python" - "$PREFECT_API_URL" <<'EOF' 2>/dev/null; then break; fi
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/health", timeout=2)
EOF
    sleep 1
  done
  for name in "$pool" "$gpu_pool" "$cluster_pool"; do
    "$venv/bin/prefect" work-pool inspect "$name" > /dev/null 2>&1 ||
      "$venv/bin/prefect" work-pool create "$name" --type process > /dev/null
  done
  "$venv/bin/prefect" --no-prompt deploy --all > "$logs/deploy.log" 2>&1 ||
    { cat "$logs/deploy.log" >&2; exit 1; }
  echo "serve: deployed $(grep -c "^  - name:" prefect.yaml) deployments (log: $logs/deploy.log)"
  if ! running worker; then
    setsid "$venv/bin/prefect" worker start --pool "$pool" --type process \
      > "$logs/prefect-worker.log" 2>&1 &
    echo $! > "$pids/worker"
    echo "serve: worker started on pool $pool (log: $logs/prefect-worker.log)"
  fi
  status
  echo "next: export PREFECT_API_URL=$PREFECT_API_URL"
  echo "      $venv/bin/prefect deployment run 'r1-pipeline/tiny' --watch"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: bash scripts/serve.sh [start|stop|status]" >&2; exit 2 ;;
esac
