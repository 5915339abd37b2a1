"""The CPUs a process may use and the thread settings the project hands its processes
(host/threads.py), as small worked cases: cgroup quotas (v1, v2, nested), shares, environments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from host import threads
from host.threads import (
    FALLBACK_ENV,
    PASSIVE,
    SHORT_SPIN,
    cgroup_cpu_limit,
    child_env,
    process_threads,
    share,
    thread_vars,
    user_wait_vars,
)

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_v2_quota_is_read_along_the_folders_above_the_process_the_tightest_winning(tmp_path):
    root, proc = tmp_path / "cg", tmp_path / "cgroup"
    write(proc, "0::/machine/job\n")
    write(root / "cpu.max", "max 100000\n")  # the root: no quota
    write(root / "machine" / "cpu.max", "300000 100000\n")  # 3 CPUs
    write(root / "machine" / "job" / "cpu.max", "150000 100000\n")  # 1.5 CPUs
    assert cgroup_cpu_limit(root, proc) == 1.5


def test_no_quota_anywhere_is_none(tmp_path):
    root, proc = tmp_path / "cg", tmp_path / "cgroup"
    write(proc, "0::/job\n")
    write(root / "job" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(root, proc) is None
    assert cgroup_cpu_limit(root, tmp_path / "missing") is None


def test_a_v1_quota_is_read_from_the_cpu_controllers_mount(tmp_path):
    root, proc = tmp_path / "cg", tmp_path / "cgroup"
    write(proc, "4:memory:/job\n2:cpu,cpuacct:/job\n0::/\n")
    write(root / "cpu,cpuacct" / "job" / "cpu.cfs_quota_us", "50000\n")
    write(root / "cpu,cpuacct" / "job" / "cpu.cfs_period_us", "100000\n")
    write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")  # the root: none
    write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(root, proc) == 0.5


def test_a_container_whose_cgroup_path_is_not_under_its_mount_reads_the_mount_itself(tmp_path):
    root, proc = tmp_path / "cg", tmp_path / "cgroup"
    write(proc, "0::/kubepods/pod1/abc\n")  # the host's path; the container sees its own root
    write(root / "cpu.max", "200000 100000\n")
    assert cgroup_cpu_limit(root, proc) == 2.0


@pytest.mark.parametrize(
    ("affinity", "quota", "usable"), [(16, None, 16), (16, 1.5, 2), (16, 0.2, 1), (2, 8.0, 2)]
)
def test_usable_cpus_are_the_affinity_cut_to_the_quota_rounded_up(
    monkeypatch, affinity, quota, usable
):
    monkeypatch.setattr(threads, "affinity_cpus", lambda: affinity)
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: quota)
    assert threads.usable_cpus() == usable


def test_processes_side_by_side_share_the_cpus_each_keeping_one():
    assert share(2, cpus=16) == 8
    assert share(3, cpus=16) == 5
    assert share(4, cpus=2) == 1


def test_a_process_runs_the_cpus_it_may_use_at_most_the_profiles_count(monkeypatch):
    monkeypatch.setattr(threads, "usable_cpus", lambda: 1)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert process_threads(2) == 1  # a 1-CPU container: not the profile's 2
    monkeypatch.setattr(threads, "usable_cpus", lambda: 16)
    assert process_threads(2) == 2
    assert process_threads(None) == 16
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's word
    assert process_threads(None) == 3


def test_a_child_waits_passively_with_its_own_thread_count_unless_the_user_chose_how():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "8"}
    wait = {"OMP_WAIT_POLICY": PASSIVE, "GOMP_SPINCOUNT": SHORT_SPIN}
    assert child_env(2, base) == {"PATH": "/bin", "OMP_NUM_THREADS": "2"} | wait
    chosen = base | {"OMP_WAIT_POLICY": "ACTIVE"}  # the user's policy, and no spin count added
    wanted = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE"}
    assert child_env(1, chosen) == wanted
    assert child_env(1, base | {"GOMP_SPINCOUNT": "0"})["GOMP_SPINCOUNT"] == "0"
    assert thread_vars(0, {}) == wait | {"OMP_NUM_THREADS": "1"}


def test_the_projects_own_fallback_is_not_the_users_choice_and_a_child_is_not_governed():
    """What `settle_process` leaves for children is marked as the project's: a process that
    settles itself may govern its waiting instead, and a child started beside others of the
    project's (`child_env`) keeps the fixed setting, unmarked."""
    wait = {"OMP_WAIT_POLICY": PASSIVE, "GOMP_SPINCOUNT": SHORT_SPIN}
    inherited = {"PATH": "/bin", FALLBACK_ENV: "PASSIVE/1000"} | wait
    assert user_wait_vars(inherited) == {}
    assert user_wait_vars(wait) == wait  # no mark: the user's
    chosen = inherited | {"OMP_WAIT_POLICY": "ACTIVE"}  # the user's, beside an inherited mark
    assert user_wait_vars(chosen) == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": SHORT_SPIN}
    assert child_env(1, inherited) == {"PATH": "/bin", "OMP_NUM_THREADS": "1"} | wait


def test_the_module_loads_without_torch():
    """It runs before torch is imported, so it must not import torch itself."""
    code = "import sys, host.threads; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_a_cpu_quota_below_the_affinity_mask_is_not_governed(monkeypatch):
    """The kernel's readings would speak of CPUs the process does not share: it waits fixed."""
    monkeypatch.setattr(threads, "affinity_cpus", lambda: 16)
    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    assert not threads.governable()
    monkeypatch.setattr(threads, "usable_cpus", lambda: 16)
    assert threads.governable() == (hasattr(threads.os, "sched_getaffinity"))
