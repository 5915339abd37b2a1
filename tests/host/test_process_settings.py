"""Every kind of process the project starts waits as host/threads.py says and runs a thread count
that fits the CPUs, read from each child itself: its OpenMP runtime (libgomp prints its settings
when it loads under OMP_DISPLAY_ENV=VERBOSE: GOMP_SPINCOUNT 1000 is the project's fixed short
spin before sleeping, 300000 libgomp's default, which an entry point keeps and governs) or its
environment. The parent's environment has no wait setting, as a user's shell.

The Ray actors are checked in tests/cluster/test_sampling_on_actors.py (a cluster is started)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from configs.supervised import EngineConfig
from host.threads import FALLBACK_ENV, SHORT_SPIN, fallback_mark, governable, share
from models.saved import save_model
from sampling.workers.process import ProcessWorkers
from tests.tiny_models import grpo_config, make_tokenizer, tiny_model
from training.distributed import ProcessGroup, free_port, launch_command, worker_env

ROOT = Path(__file__).resolve().parents[2]
SPIN = re.compile(r"GOMP_SPINCOUNT = '(\d+)'")
SHORT = int(SHORT_SPIN)
# an entry point keeps libgomp's own spin to govern it where the machine allows (host/threads.py
# `governable`: not under a CPU quota below the affinity mask); else it waits passively, fixed
ENTRY_SPIN = 300000 if governable() else SHORT


@pytest.fixture
def shell(monkeypatch) -> dict[str, str]:
    """This process's environment as a user's shell has it (no wait policy), with the OpenMP
    runtime of every child told to print its settings."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.setenv("OMP_DISPLAY_ENV", "VERBOSE")
    return dict(os.environ)


def child_environ(pid: int, running: str, deadline_s: float = 60) -> dict[str, str]:
    """The environment a child started with, read once it runs `running` (in its command
    line): until its exec, a forked child shows its parent's."""
    deadline = time.monotonic() + deadline_s
    while running not in Path(f"/proc/{pid}/cmdline").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    text = Path(f"/proc/{pid}/environ").read_text()
    return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)


def spin_counts(text: str) -> list[int]:
    return [int(n) for n in SPIN.findall(text)]


def test_a_plain_torch_process_spins_which_is_what_the_checks_below_tell_apart(shell):
    out = subprocess.run(
        [sys.executable, "-c", "import torch"], env=shell, capture_output=True, text=True
    )
    assert spin_counts(out.stderr) == [300000]


@pytest.mark.parametrize(("chosen", "spin"), [(None, ENTRY_SPIN), ("ACTIVE", 30000000000)])
def test_the_r1_command_keeps_the_long_spin_to_govern_it_unless_the_user_chose(shell, chosen, spin):
    """Governed (tests/host/test_waiting.py): libgomp loads with its own spin, which the
    governor shortens while other work is busy; the user's choice is loaded as it is."""
    env = shell | ({"OMP_WAIT_POLICY": chosen} if chosen else {})
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "config", "--profile", "micro"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert spin_counts(out.stderr) == [spin]


def test_every_deployment_starts_its_flow_run_governed_or_waiting_passively():
    """Whichever worker runs a deployment (ours or `prefect worker start`), its job variables
    put the fixed wait setting, marked as the project's, in the flow-run process's environment,
    and the flow module settles it before torch loads: governed, as the r1 command."""
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    for deployment in spec["deployments"]:
        env = deployment["work_pool"]["job_variables"]["env"]
        assert env["OMP_WAIT_POLICY"] == "PASSIVE", deployment["name"]
        assert env["GOMP_SPINCOUNT"] == SHORT_SPIN, deployment["name"]
        assert env[FALLBACK_ENV] == "PASSIVE/1000", deployment["name"]
        module = deployment["entrypoint"].split(":")[0]
        assert "\nsettle_process()\n" in (ROOT / module).read_text(), module


def test_a_flow_module_loaded_by_its_path_governs_before_torch_loads(shell):
    """As a worker's flow-run process loads an entrypoint: by path, the deployment's
    environment in place, then the stages' code as the flow runs; libgomp then loads with its
    own spin, not the inherited 1,000."""
    code = (
        "import importlib.util; "
        "spec = importlib.util.spec_from_file_location('flow', 'flows/distill.py'); "
        "spec.loader.exec_module(importlib.util.module_from_spec(spec)); "
        "from flows import load_stage_code; load_stage_code(); "
        "from host.waiting import governor; import sys; "
        "print('governed', governor() is not None, 'torch' in sys.modules)"
    )
    wait = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": SHORT_SPIN}
    env = shell | wait | {FALLBACK_ENV: fallback_mark(wait)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"governed {governable()} True" in out.stdout
    torch_runtime, *later = spin_counts(out.stderr)
    assert torch_runtime == ENTRY_SPIN
    # another library's OpenMP runtime loaded after torch's (scikit-learn's, which transformers 5.17
    # and 5.20 import) reads the short spin the entry point set for what starts after it
    assert all(spin == SHORT for spin in later), later


def test_the_worker_sets_it_before_it_starts_any_flow_run(shell, monkeypatch):
    import cli.worker

    seen = {}

    async def serve(pool: str, grace: float) -> None:  # where the worker would start polling
        seen["wait"] = (os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"))

    monkeypatch.setattr(cli.worker, "serve", serve)
    cli.worker.main(["--pool", "p"])
    assert seen == {"wait": ("PASSIVE", SHORT_SPIN)}


@pytest.mark.heavy  # a sampler process loads torch and a model
def test_a_sampler_process_waits_passively_with_its_thread_count(shell, tmp_path, capfd):
    tokenizer = make_tokenizer()
    policy = save_model(tiny_model(tokenizer), tokenizer, tmp_path / "policy").path
    before = torch.get_num_threads()
    workers = ProcessWorkers(grpo_config().sampler, policy, 8, threads=1)
    try:
        environ = child_environ(workers.pids[0], "sampling.workers.process")
        assert environ["OMP_WAIT_POLICY"] == "PASSIVE" and environ["OMP_NUM_THREADS"] == "1"
        assert environ["GOMP_SPINCOUNT"] == SHORT_SPIN
        said, deadline = "", time.monotonic() + 120
        while not spin_counts(said) and time.monotonic() < deadline:
            time.sleep(0.5)
            said += capfd.readouterr().err
    finally:
        workers.close()
    assert spin_counts(said) == [SHORT]
    assert torch.get_num_threads() == before  # the trainer's own count, placement or not


@pytest.mark.heavy  # torchrun starts two ranks
def test_training_ranks_wait_passively_and_share_the_cpus(shell, tmp_path):
    engine = EngineConfig(kind="deepspeed", processes=2)
    command = launch_command(
        engine, tmp_path / "spec.json", free_port(), "tests.host.report_threads"
    )
    group = ProcessGroup(command, worker_env(engine), "threads", on_line=lambda line: None)
    deadline = time.monotonic() + 120
    while group.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    group.stop()
    said = "".join(group.tail)
    assert group.poll() == 0, said
    ranks = [
        json.loads(line.split("rank settings ", 1)[1])
        for line in said.splitlines()
        if "rank settings " in line
    ]
    threads = share(engine.processes)
    wanted = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": SHORT_SPIN}
    wanted |= {"OMP_NUM_THREADS": str(threads), "torch_threads": threads}
    assert ranks == [wanted, wanted]
    assert spin_counts(said) and set(spin_counts(said)) == {SHORT}  # the launcher's, the ranks'
