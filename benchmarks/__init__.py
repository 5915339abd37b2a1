"""Side-by-side measurements, each `python -m benchmarks.NAME`. torch's threads wait without
spinning in each (host/threads.py), set here before any benchmark loads torch."""

from host.threads import settle_process

settle_process()
