"""A state folder whose disk fills, or that cannot be written, while the pipeline runs: the stage
stops in one line naming the folder and its free space (and what it needed, where known), the
last checkpoint stays the checkpoint, and a run on a disk without room for a training stage is
refused before anything runs.

A small disk (or a read-only one) is a tmpfs mounted in a user namespace (`unshare -Urm`), where
a process may mount without root."""

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from prefect import flow, task

from storage.disk import StateDiskError
from tasks.context import RunContext
from tasks.stage_cache import stage_task, telling_full_disks

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def can_mount() -> bool:
    """Whether a user namespace may mount a tmpfs here."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            made = subprocess.run(
                ["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {folder}"],
                capture_output=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return made.returncode == 0


needs_mount = pytest.mark.skipif(
    not can_mount(), reason="unshare -Urm cannot mount a tmpfs here (user namespaces refused)"
)


def on_small_disk(
    folder: Path, size: str, program: list[str], timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run `program` (from the project's root) where `folder` is a tmpfs of `size`."""
    script = 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"'
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script, "sh", size, str(folder), *program],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


# Saves a small checkpoint, then one larger than the disk; prints what the second save raised
# and what is left to resume from.
CHECKPOINTS = """
import json, sys, torch
from pathlib import Path
from training.checkpoints import load_checkpoint, save_checkpoint

folder = Path(sys.argv[1]) / "runs" / "sft" / "key" / "checkpoints"
save_checkpoint(folder, {"fingerprint": "run", "weights": torch.ones(100_000)})
try:
    save_checkpoint(folder, {"fingerprint": "run", "weights": torch.zeros(2_000_000)})
    raised = None
except Exception as error:
    raised = [type(error).__name__, str(error)]
state = load_checkpoint(folder, "run")
print(json.dumps({"raised": raised, "left": sorted(p.name for p in folder.iterdir()),
                  "resumes_from": float(state["weights"].sum())}))
"""


@needs_mount
def test_a_checkpoint_the_disk_cannot_hold_is_told_in_one_line_and_the_last_one_kept(tmp_path):
    ran = on_small_disk(tmp_path, "4m", [sys.executable, "-c", CHECKPOINTS, str(tmp_path)])
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout.strip().splitlines()[-1])
    kind, message = found["raised"]
    assert kind == "StateDiskError"  # torch.save said only "unexpected pos 576 vs 534"
    assert "\n" not in message
    folder = tmp_path / "runs" / "sft" / "key" / "checkpoints"
    assert f"the last one, {folder / 'last'}, is kept" in message
    assert f"the disk of {folder} is full (" in message
    assert "free of 4.0 MiB; about 7.6 MiB needed)" in message
    assert "run the same command again" in message
    assert found["left"] == ["last"]  # no part of the new one left behind
    assert found["resumes_from"] == 100_000.0  # the last checkpoint, whole


@needs_mount
def test_a_run_on_a_disk_without_room_for_a_stage_is_refused_before_anything_runs(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    command = [sys.executable, "-m", "cli.main", "run", "--profile", "micro"]
    ran = on_small_disk(state, "12m", [*command, "--state-dir", str(state / "new")])
    assert ran.returncode == 3, ran.stderr[-3000:]
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran.stderr[-3000:]
    assert (
        lines[0].startswith("r1: ")
        and "configs/micro.yaml: the disk of the state folder" in lines[0]
    )
    assert f"{state / 'new'} has 12.0 MiB free of 12.0 MiB" in lines[0]
    assert "or SFT stage needs about 17.1 MiB (bootstrap: 35,104 parameters" in lines[0]
    assert "nothing has run" in lines[0]
    assert not (state / "new").exists()  # the run touched nothing


# Fills the disk, then writes through each store's library; prints the line `r1 run` ends with
# for each failure, and for a failure that names no disk (a Prefect server whose database is on
# the full disk answers 500).
WRITERS = """
import contextlib, json, sqlite3, sys
from pathlib import Path
import duckdb, torch
from safetensors.torch import save_file
from cli.failures import run_failure_line

root = Path(sys.argv[1])
with open(root / "filler", "wb") as filler, contextlib.suppress(OSError):  # to the last byte
    while True:
        filler.write(b"x" * 65536)

def duck():
    with duckdb.connect(str(root / "r1.duckdb")) as con:
        con.execute("create table t as select range i, repeat('a', 100) s from range(100000)")

def lite():
    con = sqlite3.connect(root / "mlflow.db")
    con.execute("create table t(s)")
    con.executemany("insert into t values (?)", [("a" * 1000,)] * 1000)
    con.commit()

def weights():
    save_file({"w": torch.zeros(100_000)}, str(root / "model.safetensors"))

def plain():
    (root / "config.json").write_text("{}" * 10_000)

def server():
    raise RuntimeError("Server error '500 Internal Server Error' for url '.../set_state'")

lines = {}
for write in (duck, lite, weights, plain, server):
    try:
        write()
        lines[write.__name__] = None
    except Exception as error:
        lines[write.__name__] = run_failure_line(error, root)
print(json.dumps(lines))
"""


@needs_mount
def test_each_stores_full_disk_ends_the_run_in_one_line_naming_the_folder(tmp_path):
    ran = on_small_disk(tmp_path, "2m", [sys.executable, "-c", WRITERS, str(tmp_path)])
    assert ran.returncode == 0, ran.stderr
    lines = json.loads(ran.stdout.strip().splitlines()[-1])
    for writer, line in lines.items():
        assert line is not None, writer
        assert "\n" not in line
        assert line.startswith(f"r1: the run failed: the disk of {tmp_path} is full ("), line
        assert "free of 2.0 MiB" in line and "run the same command again" in line, line
    assert lines["server"].endswith("(RuntimeError: Server error '500 Internal Server Error' "
                                    "for url '.../set_state')")  # fmt: skip


@stage_task("writing-stage", stage="writer")
def writer(ctx: RunContext) -> str:
    with open("/dev/full", "wb") as disk:  # a disk with no space left, for real
        disk.write(b"w" * (1 << 20))
    return "written"


@flow(name="one-writing-stage")
def one_writing_stage(state: str) -> str:
    return writer(RunContext(Path(state), "parent", "flow-run", "r1-test"))


@pytest.mark.usefixtures("prefect_server")
def test_a_stage_that_meets_a_full_disk_stops_in_one_line_naming_the_stage(tmp_path):
    with pytest.raises(StateDiskError) as info:  # before: OSError: [Errno 28] No space left ...
        one_writing_stage(str(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "writer: a disk it writes to is full (OSError: [Errno 28] No space left on device), "
        f"though the state folder's, {tmp_path}, has "
    )  # /dev/full is full; the state folder's disk is not
    assert message.endswith(": free space on the disk it wrote to and run the same command again")


@stage_task("refused-stage", stage="refused")
def refused(ctx: RunContext) -> str:
    Path("/sys/r1-checkpoints").mkdir()  # a folder no process may write in, root's included
    return "written"


@flow(name="one-refused-stage")
def one_refused_stage(state: str) -> str:
    return refused(RunContext(Path(state), "parent", "flow-run", "r1-test"))


def sysfs_takes_folders() -> bool:
    try:
        Path("/sys/r1-probe").mkdir()
    except OSError:
        return False
    Path("/sys/r1-probe").rmdir()
    return True


@pytest.mark.usefixtures("prefect_server")
def test_a_stage_that_cannot_write_a_folder_stops_in_one_line_naming_it(tmp_path):
    if sysfs_takes_folders():
        pytest.skip("/sys takes new folders here")
    with pytest.raises(StateDiskError) as info:  # before: PermissionError: [Errno 1] ...
        one_refused_stage(str(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("refused: cannot write in /sys (PermissionError: [Errno 1] ")
    assert message.endswith(
        "make the state folder writable (or name another with --state-dir or R1_STATE_DIR) "
        "and run the same command again"
    )


@task(name="closing-task", task_run_name="closing-task")
@telling_full_disks
def closing() -> str:
    with open("/dev/full", "wb") as disk:
        disk.write(b"report" * (1 << 18))
    return "closed"


@flow(name="one-closing-task")
def one_closing_task() -> str:
    return closing()


@pytest.mark.usefixtures("prefect_server")
def test_a_task_with_no_stage_folder_that_meets_a_full_disk_stops_in_one_line(
    tmp_path, monkeypatch
):
    """Opening and closing a pipeline run, a scheduled evaluation's steps: the same line."""
    monkeypatch.setenv("R1_STATE_DIR", str(tmp_path))
    with pytest.raises(StateDiskError) as info:  # before: OSError: [Errno 28] No space left ...
        one_closing_task()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "closing-task: a disk it writes to is full (OSError: [Errno 28] No space left on "
        f"device), though the state folder's, {tmp_path}, has "
    )


@needs_mount
def test_a_state_folder_on_a_read_only_disk_is_refused_in_one_line_before_anything_starts(
    tmp_path,
):
    state = tmp_path / "state"
    command = [sys.executable, "-m", "cli.main", "run", "--profile", "micro"]
    script = (
        'mount -t tmpfs tmpfs "$1" && mkdir -p "$1/state/prefect" "$1/state/runs" '
        '"$1/state/mlartifacts" && echo 5e1f > "$1/state/state_id" && mount -o remount,ro "$1" '
        '&& shift && exec "$@"'
    )
    ran = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script, "sh", str(tmp_path), *command],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT), "R1_STATE_DIR": str(state)},
    )
    assert ran.returncode == 2, ran.stderr[-3000:]
    lines = ran.stderr.strip().splitlines()
    assert lines == [
        f"r1: state folder {state}: cannot write in {state}: Read-only file system; make it "
        "writable, or name another (--state-dir, R1_STATE_DIR)"
    ], ran.stderr[-3000:]  # before: Prefect's server tracebacks, then a 500 from it


def test_what_the_stores_hold_already_counts_toward_the_room_they_need(tmp_path):
    """The flow checks again once `r1 run` has started Prefect's server, whose database is then
    in the state folder: the run the command accepted is not refused for the room it took."""
    from configs.profiles import load_profile
    from training.disk_fit import STORES_BYTES, disk_room_needed

    config = load_profile("micro", [])
    new = disk_room_needed(config, tmp_path / "new")
    assert new.stores == STORES_BYTES and new.stage == 35_104 * 32
    (tmp_path / "state" / "prefect").mkdir(parents=True)
    (tmp_path / "state" / "prefect" / "prefect.db").write_bytes(b"\0" * (5 << 20))
    (tmp_path / "state" / "mlflow.db-wal").write_bytes(b"\0" * (4 << 20))
    started = disk_room_needed(config, tmp_path / "state")
    assert started.stores == STORES_BYTES - (9 << 20)
    assert started.need == new.need - (9 << 20)


# Fills the disk of the state folder `paths` to its last byte.
FILL_THE_DISK = """
import contextlib
with open(paths.root.parent / "filler", "wb") as filler, contextlib.suppress(OSError):
    while True:
        filler.write(b"x" * 65536)
"""

# Makes an MLflow store as a run leaves it (write-ahead-log mode, closed), then fills the disk.
STORE_THEN_FILL = (
    """
import sys
from pathlib import Path
from mlflow import MlflowClient
from storage.paths import StatePaths
from storage.tracking import write_ahead_log

paths = StatePaths(Path(sys.argv[1])).ensure()
MlflowClient(tracking_uri=paths.tracking_uri).search_experiments()
write_ahead_log(paths.mlflow_db, 5)
"""
    + FILL_THE_DISK
)


@needs_mount
def test_r1_lineage_on_a_full_disk_says_so_in_one_line(tmp_path):
    state = tmp_path / "state"
    python = sys.executable
    script = (
        f'{python} -c "$1" "$2" && exec {python} -m cli.main lineage models:/r1-micro@final '
        '--state-dir "$2"'
    )
    ran = on_small_disk(tmp_path, "8m", ["sh", "-c", script, "sh", STORE_THEN_FILL, str(state)])
    assert ran.returncode == 2, ran.stderr[-3000:]  # before: 1, an SQLAlchemy traceback
    assert ran.stderr.strip().splitlines()[-1:] == [  # after MLflow's lines making the store
        f"r1: the disk of {state} is full (0 B free of 8.0 MiB) and MLflow's store (SQLite makes "
        "a file beside it to read it) cannot be read without some room on it (OperationalError: "
        "(sqlite3.OperationalError) disk I/O error): free space on that disk and run the command "
        "again"
    ]


# Makes an MLflow store and a run, fills the disk, then logs a metric to the run.
METRIC_ON_FULL_DISK = (
    """
import sys
from pathlib import Path
from storage.paths import StatePaths
from storage.tracking import tracking_client

paths = StatePaths(Path(sys.argv[1])).ensure()
client = tracking_client(paths)
run = client.create_run(client.create_experiment("x")).info.run_id
"""
    + FILL_THE_DISK
    + """
try:
    client.log_metric(run, "loss", 1.0, step=1)
except Exception as error:
    print("raised", type(error).__name__)
"""
)


@needs_mount
def test_mlflows_own_log_of_a_full_disk_is_its_words_without_the_traceback(tmp_path):
    ran = on_small_disk(
        tmp_path, "8m", [sys.executable, "-c", METRIC_ON_FULL_DISK, str(tmp_path / "state")]
    )
    assert ran.stdout.strip().endswith("raised MlflowException"), ran.stderr[-3000:]
    assert "database or disk is full" in ran.stderr
    assert "Traceback" not in ran.stderr, ran.stderr[-3000:]  # before: 40 lines of SQLAlchemy
