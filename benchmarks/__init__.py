"""Side-by-side measurements, each `python -m benchmarks.NAME`. How torch's threads wait is
settled here (host/threads.py: governed, or the user's choice), before any benchmark loads torch."""

from host.threads import settle_process

settle_process()
