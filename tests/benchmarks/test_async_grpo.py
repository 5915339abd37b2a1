"""The asynchronous GRPO benchmark counts its own sampler processes' CPU time, not another
run's on the same machine."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import psutil

from benchmarks.async_grpo import worker_pids


def test_only_this_processs_own_samplers_are_its_workers():
    tag = uuid.uuid4().hex  # this test's processes alone
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)", "sampling.workers.process", tag]
    mine = subprocess.Popen(sleeper)
    # another run's sampler: started by a shell that exits, so it is nobody's child here
    subprocess.run(["bash", "-c", " ".join(f"'{a}'" for a in sleeper) + " & echo $! > /dev/null"])
    deadline = time.monotonic() + 10
    others: list[int] = []
    while not others and time.monotonic() < deadline:
        others = [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if tag in (p.info["cmdline"] or []) and p.pid != mine.pid
        ]
        time.sleep(0.1)
    try:
        assert others, "the other run's sampler did not start"
        assert worker_pids() == {mine.pid}
    finally:
        mine.kill()
        for pid in others:
            psutil.Process(pid).kill()


def test_a_profile_s_deepspeed_r1_zero_runs_on_one_process_s_engine(monkeypatch):
    """`--profile gpu-tiny`: its R1-Zero (DeepSpeed in the profile, whose ranks sample
    colocated) trains on one process's engine, so that a sampler process can draw for it and
    the synchronous run it is compared with trains the same way; the rest is the profile's."""
    from benchmarks import async_grpo
    from configs import load_profile

    monkeypatch.setitem(async_grpo.PROFILE, "name", "gpu-tiny")
    config, original = async_grpo.profile(), load_profile("gpu-tiny", [])
    assert original.r1_zero.engine.kind == "deepspeed"
    assert config.r1_zero.engine.kind == "single" and config.device == "cuda"
    assert config.r1_zero.engine.precision == "fp32"  # what GRPO in one process trains in
    unchanged = {"engine"}
    assert config.r1_zero.model_dump(exclude=unchanged) == original.r1_zero.model_dump(
        exclude=unchanged
    )
    monkeypatch.setitem(async_grpo.PROFILE, "name", "tiny")
    assert async_grpo.profile() == load_profile("tiny", [])
