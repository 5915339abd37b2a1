import signal
import sys
from pathlib import Path

import pytest

from cli.main import main

REPO = Path(__file__).resolve().parents[2]

# `r1` points the process environment at its state folder: each test gets its own copy.
pytestmark = pytest.mark.usefixtures("private_environment")


def test_config_prints_the_validated_profile(capsys, tmp_path):
    assert main(["config", "--profile", "micro", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "name: r1-micro" in out and "n_samples: 2" in out


def test_a_bad_setting_exits_2_naming_the_key(capsys, tmp_path):
    code = main(["run", "--set", "cold_start_sft.train.epohcs=2", "--state-dir", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "cold_start_sft.train.epohcs: Extra inputs are not permitted" in err


def test_a_refused_run_touches_no_state_folder(capsys, tmp_path, monkeypatch):
    """A bad setting, or local inputs missing: no folder is created, nor filled."""
    state = tmp_path / "state"
    code = main(["run", "--set", "cold_start_sft.train.epohcs=2", "--state-dir", str(state)])
    assert code == 2 and not state.exists()
    state.mkdir()
    monkeypatch.chdir(tmp_path)  # no checkpoints/ or data/ here
    assert main(["run", "--profile", "gpu-qwen", "--state-dir", str(state)]) == 3
    assert main(["config", "--profile", "micro", "--state-dir", str(state)]) == 0
    assert list(state.iterdir()) == []


def test_config_prints_the_profile_and_exits_3_naming_missing_inputs(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no checkpoints/ or data/ here
    code = main(["config", "--profile", "gpu-qwen", "--state-dir", str(tmp_path / "state")])
    assert code == 3
    captured = capsys.readouterr()
    assert "name: r1-gpu-qwen" in captured.out
    assert "5 local input(s) missing" in captured.err
    assert "bootstrap.path = checkpoints/Qwen2.5-1.5B-Instruct" in captured.err


def test_a_run_started_under_nohup_keeps_sighup_ignored():
    """`nohup r1 run` must outlive its terminal; SIGTERM still stops it cleanly."""
    from cli.main import Terminated, stop_on_termination

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        stop_on_termination()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        with pytest.raises(Terminated, match="SIGTERM"):
            signal.raise_signal(signal.SIGTERM)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_runs_without_a_server_says_how_to_have_one(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert main(["runs", "--state-dir", str(tmp_path / "none")]) == 2
    assert "start the stack with `bash scripts/serve.sh`" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()  # asking creates no state folder


def test_runs_and_watch_find_the_server_serve_sh_recorded(tmp_path, monkeypatch):
    from cli.runs import connect

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    (tmp_path / "serve.env").write_text("export PREFECT_API_URL=http://127.0.0.1:4321/api\n")
    assert connect(str(tmp_path)).api_url == "http://127.0.0.1:4321/api"
    import os

    assert os.environ["PREFECT_API_URL"] == "http://127.0.0.1:4321/api"


RUN_ID = "b6d5cab5-ff6f-4e51-8c9b-d34850b1b422"


@pytest.fixture
def project_venv(monkeypatch):
    """The commands run from the project's own `.venv`, as `scripts/setup.sh` makes it."""
    monkeypatch.setattr(sys, "executable", str(REPO / ".venv" / "bin" / "python"))


def test_the_commands_printed_find_the_stack_in_a_new_shell(tmp_path, monkeypatch, project_venv):
    """A new shell has neither PREFECT_API_URL nor R1_STATE_DIR: a bare `prefect flow-run retry`
    there asked a temporary server of its own ("Flow run ... not found")."""
    from cli.runs import Served

    monkeypatch.chdir(tmp_path)
    served = Served("http://127.0.0.1:4290/api", tmp_path / "state")
    assert served.retry(RUN_ID) == (
        f"PREFECT_API_URL=http://127.0.0.1:4290/api .venv/bin/prefect flow-run retry {RUN_ID}"
    )
    assert served.watch(RUN_ID) == f".venv/bin/r1 watch {RUN_ID}"
    elsewhere = Served("http://127.0.0.1:4290/api", tmp_path / "my state")
    assert (
        elsewhere.watch(RUN_ID) == f".venv/bin/r1 watch {RUN_ID} --state-dir '{tmp_path}/my state'"
    )


def test_the_commands_printed_name_a_virtual_environment_elsewhere_whole(tmp_path, monkeypatch):
    """With `R1_VENV` outside the project (`/opt/r1 env`), `.venv/bin/prefect` would not be found
    at the project's root: the commands name the environment's own, quoted for the shell."""
    from cli.runs import Served

    monkeypatch.setattr(sys, "executable", str(tmp_path / "r1 env" / "bin" / "python"))
    served = Served("http://127.0.0.1:4290/api", tmp_path / "state")
    prefect, r1 = f"'{tmp_path}/r1 env/bin/prefect'", f"'{tmp_path}/r1 env/bin/r1'"
    assert served.retry(RUN_ID) == (
        f"PREFECT_API_URL=http://127.0.0.1:4290/api {prefect} flow-run retry {RUN_ID}"
    )
    assert served.watch(RUN_ID) == f"{r1} watch {RUN_ID} --state-dir {tmp_path}/state"


def test_a_crashed_runs_ending_names_the_retry_with_the_stacks_api(tmp_path, project_venv):
    from types import SimpleNamespace

    from prefect.states import Crashed

    from cli.runs import Served
    from cli.watch import ending

    crashed = Crashed(message="Execution was aborted by a signal.")
    run = SimpleNamespace(id=RUN_ID, state=crashed, deployment_id=RUN_ID)  # a deployment's run
    client = SimpleNamespace(read_task_runs=lambda **_: [])
    lines, status = ending(client, run, Served("http://127.0.0.1:4290/api", tmp_path))
    assert status == 1
    assert (
        f"  PREFECT_API_URL=http://127.0.0.1:4290/api .venv/bin/prefect flow-run retry {RUN_ID}"
        in lines
    )
    assert f"  .venv/bin/r1 watch {RUN_ID} --state-dir {tmp_path}" in lines


@pytest.mark.parametrize("command", [["runs"], ["watch", RUN_ID]])
def test_runs_and_watch_without_a_server_at_the_address_say_so_in_one_line(command, tmp_path):
    """In a process of their own: Prefect reads its settings once, as it is imported."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/api"  # nothing answers there once closed
    r1 = Path(sys.executable).with_name("r1")
    ran = subprocess.run(
        [str(r1), *command, "--state-dir", str(tmp_path)],
        env=os.environ | {"PREFECT_API_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert ran.stderr == (
        f"r1 {command[0]}: no Prefect server answers at {url}: start the stack with `bash "
        "scripts/serve.sh` (or point PREFECT_API_URL at a running server)\n"
    )


def test_watch_refuses_what_is_not_a_flow_run_id(capsys):
    assert main(["watch", "ef21620f-1749-49b6-96a6-3a90c9c"]) == 2
    assert "is not a flow run id (`r1 runs` lists them)" in capsys.readouterr().err


def test_a_failed_runs_reason_drops_prefects_preamble():
    from cli.failures import exception_text
    from cli.runs import RunLine

    message = "Task run encountered an exception InjectedFailure: reasoning_rl: at step 2"
    assert exception_text(message) == "InjectedFailure: reasoning_rl: at step 2"
    line = RunLine("ef21620f-1749-49b6-96a6-3a90c9c1b2c3", "Failed", "r1-pipeline/micro", None, "x")
    head, reason = line.lines()
    assert head.startswith("ef21620f-1749-49b6-96a6-3a90c9c1b2c3  Failed ")
    assert len(head) <= 80 and reason == "    x"


@pytest.mark.heavy  # a Prefect temporary server
def test_a_failing_run_shows_its_traceback_once_and_ends_with_why(tmp_path):
    """As the README's `--set cluster.address=...` on a cluster that cannot hold the run: the
    failing task's traceback once, then one line per record, and `r1 run`'s last line says why."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing answers there once closed
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    r1 = Path(sys.executable).with_name("r1")
    ran = subprocess.run(
        [str(r1), "run", "--profile", "micro", "--set", f"cluster.address=127.0.0.1:{port}",
         "--state-dir", str(tmp_path / "state")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert ran.returncode == 1, ran.stderr[-3000:]
    assert ran.stderr.count("Traceback (most recent call last") == 1, ran.stderr
    ours = [line for line in ran.stderr.splitlines() if line.startswith("r1: ")]
    assert ours == [
        f"r1: the run failed: ClusterUnreachableError: cannot reach the Ray cluster's head at "
        f"127.0.0.1:{port} (cluster.address '127.0.0.1:{port}'): [Errno 111] Connection refused. "
        f"Start one with `ray start --head --port {port}` on that machine, or fix "
        "cluster.address; nothing has run"
    ]
    after = ran.stderr.split(ours[0])[1].strip().splitlines()
    assert all("Stopping temporary server" in line for line in after), after  # the last word


def test_a_retry_is_suggested_only_where_it_can_end_otherwise():
    from cli.failures import retry_helps

    assert retry_helps("reasoning_rl: InjectedFailure: reasoning_rl: injected failure at step 2")
    assert retry_helps("Execution was aborted by a termination signal.")
    assert retry_helps("No heartbeat for 90 s: the flow run's process or its worker is gone")
    assert retry_helps("open-pipeline-run: ClusterUnreachableError: cannot reach the head")
    assert not retry_helps(
        "registered-model: models:/r1-tiny@final: RegistryError: no registered model 'r1-tiny'"
    )
    assert not retry_helps("EvaluationRegression: models:/r1-micro@final version 3 regressed")
    assert not retry_helps("ConfigError: micro.yaml: 1 invalid setting(s)")
