"""A stand-in training rank: reports the thread settings it started with, and exits. Launched
by tests/host/test_process_settings.py through the same launcher command as a DeepSpeed rank."""

import json
import sys

from host.threads import runtime_threads

if __name__ == "__main__":
    # one write, newline included: the ranks share one pipe, and under PYTHONUNBUFFERED print's
    # separate write of the newline lets the other rank's line in between
    sys.stdout.write(f"rank settings {json.dumps(runtime_threads())}\n")
    sys.stdout.flush()
    sys.exit(0)
