"""One training step under torch's profiler, for the GPU check (benchmarks/gpu_check.py): how much
of a step's wall time the device spends running kernels. A step whose kernels fill its wall time
is device-bound (faster kernels would pay); one whose device idles between them is host-bound
(Python, launches, synchronisations: fewer, larger kernels would pay).

On a GPU the profiler records CUDA activity only (kernels, copies and fills); the device's busy
time is the union of their intervals (kernels on several streams can overlap: their sum is
printed too). On CPU, where the check only tests itself, the same figures are taken from
torch's CPU operators: the time inside them against the step's wall time.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

DEVICE_BOUND = 0.9  # busy share of the wall time above which a step is called device-bound


@dataclass
class StepProfile:
    device: str  # "cuda", or "cpu" (torch's CPU operators stand in for kernels)
    wall_seconds: float = 0.0  # the profiled step's wall time (with CUDA activity alone, the
    # profiler adds little to it; on CPU, recording every operator adds more)
    busy_seconds: float = 0.0  # the union of the device work's intervals
    kernel_seconds: float = 0.0  # the device work's durations summed
    events: int = 0
    error: str = ""


def _activities(device: torch.device, with_cpu: bool) -> list[ProfilerActivity]:
    if device.type != "cuda":
        return [ProfilerActivity.CPU]
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if with_cpu else [ProfilerActivity.CUDA]


def _intervals(prof: profile, device: torch.device) -> list[tuple[int, int]]:
    """(start, end) in ns of the device's work (CPU: torch's operators) in `prof`'s trace,
    read through the profiler's public events (kineto's own event objects differ between torch
    releases: 2.11's have no `activity_type`)."""
    wanted = DeviceType.CUDA if device.type == "cuda" else DeviceType.CPU
    return [
        (int(e.time_range.start * 1e3), int(e.time_range.end * 1e3))
        for e in prof.events()
        if e.device_type == wanted and e.time_range.end > e.time_range.start
    ]


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """The time covered by any of `intervals`."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _once(device: torch.device, step: Callable[[], object], with_cpu: bool) -> StepProfile:
    out = StepProfile(device.type)
    _synchronize(device)
    with profile(activities=_activities(device, with_cpu)) as prof:
        began = time.perf_counter()
        step()
        _synchronize(device)
        out.wall_seconds = time.perf_counter() - began
    spans = _intervals(prof, device)
    out.events = len(spans)
    out.busy_seconds = union_ns(spans) / 1e9
    out.kernel_seconds = sum(end - start for start, end in spans) / 1e9
    return out


def profile_step(device: torch.device, step: Callable[[], object]) -> dict:
    """`step` run once under the profiler, its figures as a dict (StepProfile's fields). On a
    GPU, a trace with no device work recorded is taken again with CPU activity on as well. A
    failure is reported in `error`, not raised: the step's timing stands without it."""
    try:
        out = _once(device, step, with_cpu=False)
        if not out.events and device.type == "cuda":
            out = _once(device, step, with_cpu=True)
    except Exception as error:
        out = StepProfile(device.type, error=f"{type(error).__name__}: {error}")
        out.error += "\n" + traceback.format_exc(limit=3)
    return asdict(out)


def profile_text(figures: dict, step_seconds: float) -> str:
    """The device's busy time against the profiled step's wall time, and a timed step's
    (`step_seconds`, their mean) beside it, e.g. `device busy 210 ms of 290 ms wall (72%):
    host-bound, idle 80 ms; ...`."""
    if not figures:
        return ""
    if figures.get("error"):
        return "profiler: failed (" + figures["error"].splitlines()[0] + ")"
    busy, wall = figures["busy_seconds"], figures["wall_seconds"]
    share = busy / wall if wall else 0.0
    who = "device" if figures["device"] == "cuda" else "cpu ops"
    idle = f"host-bound, idle {(wall - busy) * 1e3:.0f} ms"
    verdict = "device-bound" if share >= DEVICE_BOUND else idle
    return (
        f"profiler: {who} busy {busy * 1e3:.0f} ms of {wall * 1e3:.0f} ms wall ({share:.0%}): "
        f"{verdict}; work summed {figures['kernel_seconds'] * 1e3:.0f} ms over "
        f"{figures['events']} events; a timed step {step_seconds * 1e3:.0f} ms"
    )
