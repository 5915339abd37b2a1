"""How the benchmarks print a set of repeated measurements."""

from __future__ import annotations

import statistics


def spread(values: list[float], digits: int | None = None) -> str:
    """Median and range, e.g. `0.292 (0.281-0.305)` or `12690 (11370-12930)`; `digits` decimals,
    by default as many as the values' size calls for (3 under 10, 1 under 100, else 0)."""
    if digits is None:
        digits = 0 if max(values) >= 100 else 1 if max(values) >= 10 else 3
    median, low, high = statistics.median(values), min(values), max(values)
    return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"
