"""A stand-in training rank: reports the thread settings it started with, and exits. Launched
by tests/host/test_process_settings.py through the same launcher command as a DeepSpeed rank."""

import json
import sys

from host.threads import runtime_threads

if __name__ == "__main__":
    print("rank settings " + json.dumps(runtime_threads()), flush=True)
    sys.exit(0)
