#!/usr/bin/env bash
# The whole local stack on loopback, with its state in the project's state folder: a Prefect
# server (UI and API), a process worker with every deployment of prefect.yaml registered, and
# the MLflow UI on the state folder's store.
#
#   bash scripts/serve.sh          start what is not running, and deploy
#   bash scripts/serve.sh stop     stop all three: nothing they started is left running
#   bash scripts/serve.sh status   show what runs, and where
#   bash scripts/serve.sh env      print the lines that point a shell at the running stack
#
# Then, in any shell:
#   eval "$(bash scripts/serve.sh env)"     # export PREFECT_API_URL=http://127.0.0.1:4200/api
#   .venv/bin/prefect deployment run 'r1-pipeline/micro' --watch
#
# Settings: R1_STATE_DIR (default ./state), R1_PREFECT_PORT (default 4200), R1_MLFLOW_PORT
# (default 5000), R1_WORK_POOL (default r1-local), R1_VENV (default .venv),
# R1_CRASH_AFTER_SECONDS (default 90: a flow run unheard that long is marked Crashed).
#
# A stack that runs keeps its ports: while any of its components runs, every command takes the
# ports from the state folder's serve.env (written as the components start), whatever this
# shell sets; a port set here that differs is refused by start and status, naming the one in use.
#
# A flow run whose process is gone ends Crashed: the worker, when it stops, sends SIGTERM to its
# flow runs, which Prefect's engine reports as Crashed (cli/worker.py); a run whose process was
# killed outright, or whose machine went down, is marked Crashed by the heartbeat automation
# this script puts on the server (cli/heartbeats.py), R1_CRASH_AFTER_SECONDS after its last
# heartbeat.
#
# Each component runs in a session of its own (setsid), so `stop` signals it with everything it
# started (uvicorn workers, flow-run processes) and waits until none of them is left. SIGTERM
# ends each of them within seconds when idle; only one that is still there after
# R1_STOP_SECONDS (default 30: a flow run busy in a stage) gets SIGKILL, and `stop` says so.
# The worker is `python -m cli.worker` (cli/worker.py says why not `prefect worker start`).
#
# The server streams each flow run's logs, so `prefect deployment run --watch` prints them:
# which stage runs, how far along, and why a run failed. The pool r1-gpu is created but gets no
# worker here: `prefect deploy --all` refuses a deployment whose pool does not exist, and the
# runs of r1-pipeline/gpu wait in it for a worker on a GPU machine (README, "GPU profile").
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${R1_VENV:-.venv}"
pool="${R1_WORK_POOL:-r1-local}"
stop_seconds="${R1_STOP_SECONDS:-30}"
crash_after="${R1_CRASH_AFTER_SECONDS:-90}"
gpu_pool=r1-gpu  # prefect.yaml names it
cluster_pool=r1-cluster  # and this one: a worker on a machine of a Ray cluster (docs/cluster.md)
state="$(realpath -m "${R1_STATE_DIR:-state}")"
logs="$state/logs"
pids="$state/pids"
components="worker mlflow server"  # the order `stop` takes: the worker's runs report to both

running() { [ -f "$pids/$1" ] && kill -0 "$(cat "$pids/$1")" 2>/dev/null; }

stack_port() {  # KEY: the port of KEY's address in serve.env while a component of it runs
  local name
  [ -f "$state/serve.env" ] || return 0
  for name in $components; do
    if running "$name"; then
      sed -n "s|^export $1=http://[^:]*:\([0-9]*\).*|\1|p" "$state/serve.env"
      return 0
    fi
  done
}

# choose_port KEY SETTING DEFAULT: the running stack's port, else $SETTING, else DEFAULT; a
# SETTING that names another port than the running stack's is refused (by all but `stop`)
choose_port() {
  local running_port asked="${!2:-}"
  running_port="$(stack_port "$1")"
  if [ -z "$running_port" ]; then echo "${asked:-$3}"; return 0; fi
  if [ -n "$asked" ] && [ "$asked" != "$running_port" ] && [ "${command:-}" != stop ]; then
    echo "serve: the stack of $state runs on port $running_port, not $2=$asked: unset it, or stop the stack first (bash scripts/serve.sh stop)" >&2
    return 1
  fi
  echo "$running_port"
}

command="${1:-start}"
port="$(choose_port PREFECT_API_URL R1_PREFECT_PORT 4200)"
mlflow_port="$(choose_port R1_MLFLOW_UI R1_MLFLOW_PORT 5000)"

export R1_STATE_DIR="$state"
export PREFECT_HOME="$state/prefect"
# the stage cache (persisted task results) in it, whatever the shell says (cli/environment.py)
export PREFECT_RESULTS_LOCAL_STORAGE_PATH="$PREFECT_HOME/storage"
export PREFECT_LOCAL_STORAGE_PATH="$PREFECT_HOME/storage"
export PREFECT_API_URL="http://127.0.0.1:$port/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_SERVER_API_HOST=127.0.0.1
export MLFLOW_TRACKING_URI="sqlite:///$state/mlflow.db"
export MLFLOW_SKIP_PIP_REQUIREMENTS_CHECK=true
export R1_MLFLOW_UI="http://127.0.0.1:$mlflow_port"  # where the runs' reports link to
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# the processes of a component's session: itself and whatever it started
session() { pgrep -s "$1" 2>/dev/null || true; }

stop_one() {
  local name="$1" pid waited=0
  pid="$(cat "$pids/$name")"
  kill -TERM -- "-$pid" 2>/dev/null || true
  while [ -n "$(session "$pid")" ] && [ "$waited" -lt $((stop_seconds * 4)) ]; do
    sleep 0.25
    waited=$((waited + 1))
  done
  if [ -n "$(session "$pid")" ]; then
    pkill -KILL -s "$pid" 2>/dev/null || true
    while [ -n "$(session "$pid")" ]; do sleep 0.1; done
    echo "serve: killed the $name (still running ${stop_seconds}s after SIGTERM)"
  else
    echo "serve: stopped the $name ($((waited / 4)).$((waited % 4 * 25))s)"
  fi
}

stop() {
  for name in $components; do
    if running "$name"; then stop_one "$name"; fi
    rm -f "$pids/$name"
  done
  rm -f "$state/serve.env"
}

status() {
  for name in server worker mlflow; do
    if running "$name"; then echo "$name: running (pid $(cat "$pids/$name"))"
    else echo "$name: stopped"; fi
  done
  echo "Prefect UI: http://127.0.0.1:$port   API: $PREFECT_API_URL"
  echo "MLflow UI:  $R1_MLFLOW_UI/#/experiments?workflowType=machine_learning"
  echo "state:      $state"
}

# start_one NAME LOG COMMAND...: COMMAND in a session of its own, its output in LOG; the log of
# its previous start (what happened before a reboot or a stop: a crashed run's traceback in the
# worker's) is kept as LOG.1, the one before it dropped
start_one() {
  local name="$1" log="$2"
  shift 2
  if [ -s "$log" ]; then mv -f "$log" "$log.1"; fi
  setsid "$@" > "$log" 2>&1 &
  echo $! > "$pids/$name"
}

wait_healthy() {  # URL NAME LOG: up to 120 s for URL to answer, or fail naming the log
  for _ in $(seq 1 240); do
    if "$venv/bin/python" - "$1" <<'EOF' 2>/dev/null; then return 0; fi
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=2)
EOF
    if ! running "$2"; then break; fi
    sleep 0.5
  done
  echo "serve: the $2 did not come up; its log, $3:" >&2
  tail -20 "$3" >&2
  exit 1
}

wait_ready() {  # LOG: up to 120 s for the worker to have ended the runs left without a process
  for _ in $(seq 1 240); do
    if grep -q "^worker ready: " "$1" 2>/dev/null; then return 0; fi
    if ! running worker; then break; fi
    sleep 0.5
  done
  echo "serve: the worker did not come up; its log, $1:" >&2
  tail -20 "$1" >&2
  exit 1
}

start() {
  bash scripts/setup.sh
  mkdir -p "$logs" "$pids" "$PREFECT_HOME"
  if ! running server; then
    # a new state folder starts from a migrated empty database (cli/prefect_server.py)
    if [ ! -f "$PREFECT_HOME/prefect.db" ]; then
      "$venv/bin/python" -m cli.prefect_server --seed "$PREFECT_HOME" > /dev/null \
        || echo "serve: no Prefect database template; the server migrates a new database" >&2
    fi
    # the log stream lets `prefect deployment run --watch` print each run's logs
    start_one server "$logs/prefect-server.log" env PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED=true \
      PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED=true \
      "$venv/bin/prefect" server start --host 127.0.0.1 --port "$port"
    echo "serve: Prefect server starting on 127.0.0.1:$port (log: $logs/prefect-server.log)"
  fi
  if ! running mlflow; then
    # one worker and no job runner: two processes rather than the dozen of `mlflow ui`
    start_one mlflow "$logs/mlflow-ui.log" env MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
      "$venv/bin/mlflow" server --host 127.0.0.1 --port "$mlflow_port" --workers 1 \
      --backend-store-uri "$MLFLOW_TRACKING_URI" \
      --default-artifact-root "file://$state/mlartifacts"
    echo "serve: MLflow UI starting on 127.0.0.1:$mlflow_port (log: $logs/mlflow-ui.log)"
  fi
  environment > "$state/serve.env"  # its ports, for the commands that come while it starts
  wait_healthy "$PREFECT_API_URL/health" server "$logs/prefect-server.log"
  "$venv/bin/python" -m cli.work_pools "$pool" "$gpu_pool" "$cluster_pool" > /dev/null
  "$venv/bin/prefect" --no-prompt deploy --all > "$logs/deploy.log" 2>&1 ||
    { cat "$logs/deploy.log" >&2; exit 1; }
  echo "serve: deployed $(grep -c "^  - name:" prefect.yaml) deployments (log: $logs/deploy.log)"
  "$venv/bin/python" -m cli.heartbeats --within "$crash_after" | sed 's/^/serve: /'
  if ! running worker; then
    # its flow runs get the stop's time, less a margin, to report Crashed before the worker exits
    start_one worker "$logs/prefect-worker.log" "$venv/bin/python" -m cli.worker --pool "$pool" \
      --grace "$(( stop_seconds > 10 ? stop_seconds - 5 : stop_seconds / 2 ))"
    echo "serve: worker started on pool $pool (log: $logs/prefect-worker.log)"
  fi
  wait_ready "$logs/prefect-worker.log"
  wait_healthy "$R1_MLFLOW_UI/health" mlflow "$logs/mlflow-ui.log"
  status
  echo "next, in any shell: eval \"\$(bash scripts/serve.sh env)\"   (or: export PREFECT_API_URL=$PREFECT_API_URL)"
  echo "      $venv/bin/prefect deployment run 'r1-pipeline/micro' --watch"
}

environment() {  # the lines that point a shell at this stack
  printf 'export PREFECT_API_URL=%s\nexport R1_MLFLOW_UI=%s\n' "$PREFECT_API_URL" "$R1_MLFLOW_UI"
}

case "$command" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env)  # what the running stack left in the state folder: its ports, not this shell's settings
    if [ -f "$state/serve.env" ]; then cat "$state/serve.env"
    else echo "serve: no stack serves $state (start it: bash scripts/serve.sh)" >&2; exit 1; fi ;;
  *) echo "usage: bash scripts/serve.sh [start|stop|status|env]" >&2; exit 2 ;;
esac
