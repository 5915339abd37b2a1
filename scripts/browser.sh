#!/usr/bin/env bash
# Best effort: installs Debian's chromium for the MLflow UI test (tests/operations/test_mlflow_ui.py) when it
# is missing. Never fails its caller: without a browser that test skips and says why.
# Prints one line saying what happened. R1_BROWSER_TIMEOUT bounds each apt-get step (seconds;
# the install took 20 s on a machine of this project's kind).
set -u

limit="${R1_BROWSER_TIMEOUT:-120}"

if command -v chromium >/dev/null 2>&1; then
  echo "browser: chromium present ($(command -v chromium))" >&2
  exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "browser: chromium missing and not installable here (needs root and apt-get); the UI test will skip" >&2
  exit 0
fi

start=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
install_chromium() {
  timeout "$limit" apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1
}
# The package lists may be stale or missing: refresh them once if the first try fails.
if { install_chromium || { timeout "$limit" apt-get update -qq >/dev/null 2>&1 && install_chromium; }; } \
  && command -v chromium >/dev/null 2>&1; then
  echo "browser: installed chromium in $(($(date +%s) - start))s" >&2
else
  echo "browser: could not install chromium (after $(($(date +%s) - start))s); the UI test will skip" >&2
fi
exit 0
