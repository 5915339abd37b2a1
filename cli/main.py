"""`r1 run` runs the pipeline flow on a profile and prints the per-stage table; `r1 config`
shows the validated profile (and, exit status 3, the local inputs it lacks); `r1 lineage MODEL`
prints a registered model's chain back to the raw problems; `r1 runs` lists the Prefect
server's flow runs and why each failed; `r1 watch ID` follows one to its end."""

from __future__ import annotations

import argparse
import logging
import math
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import yaml

from cli.import_path import project_first

# before any other package of the project is imported: a PYTHONPATH of another project's
# `training` or `models` must not stand in for ours (cli/import_path.py)
PUT_FIRST = project_first()

from cli.environment import (  # noqa: E402
    prepare_environment,
    unused_mlflow_settings,
    unused_result_settings,
)
from cli.runs import MAX_RUNS, STATE_TYPES, command_path  # noqa: E402
from host.threads import settle_process  # noqa: E402
from storage.paths import StatePaths  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="r1", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("run", "run the pipeline flow"),
        ("config", "print the validated profile"),
    ):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument(
            "--profile", default="tiny", help="profile name in configs/ or a YAML path"
        )
        cmd.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override one setting, e.g. --set cold_start_sft.train.epochs=1 (repeatable)",
        )
        cmd.add_argument(
            "--state-dir", help="where runs keep their state (default: $R1_STATE_DIR or ./state)"
        )
    sub.choices["config"].add_argument(
        "--gpu-gib",
        type=_gib,
        help="also estimate each GPU training stage's peak memory against a GPU of this many "
        "GiB (training/memory.py; checkpoints' shapes are read from their config.json)",
    )
    sub.choices["run"].add_argument(
        "--flow",
        choices=["r1_pipeline", "r1_zero"],
        default="r1_pipeline",
        help="the whole recipe (default), or R1-Zero: GRPO straight on the base",
    )
    lineage = sub.add_parser("lineage", help="print a registered model's chain to the problems")
    lineage.add_argument("model", help="models:/NAME@ALIAS, NAME@ALIAS or models:/NAME/VERSION")
    lineage.add_argument("--json", action="store_true", help="print the chain as JSON")
    lineage.add_argument(
        "--state-dir", help="the state folder to read (default: $R1_STATE_DIR or ./state)"
    )
    runs = sub.add_parser(
        "runs", help="list the Prefect server's recent flow runs, ids whole, and why each failed"
    )
    runs.add_argument(
        "--state",
        dest="states",
        action="append",
        default=[],
        type=str.lower,
        choices=STATE_TYPES,
        help="only runs in this state (repeatable), e.g. --state failed --state crashed",
    )
    runs.add_argument(
        "--limit", type=_run_count, default=15, help="how many runs, 1 to 200 (default 15)"
    )
    watch = sub.add_parser(
        "watch", help="follow a flow run (a retry too) to its end; say why it failed"
    )
    watch.add_argument("flow_run_id", help="the flow run's id, as `r1 runs` prints it")
    for cmd in (runs, watch):
        cmd.add_argument(
            "--state-dir", help="the state folder `scripts/serve.sh` serves (default: ./state)"
        )
    return parser


def _gib(text: str) -> float:
    """A GPU's memory in GiB: a finite number above 0."""
    try:
        gib = float(text)
    except ValueError:
        gib = math.nan
    if not (math.isfinite(gib) and gib > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of GiB above 0, e.g. 80")
    return gib


def _run_count(text: str) -> int:
    """How many flow runs to list: 1 to 200, what Prefect's server answers."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_RUNS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number from 1 to {MAX_RUNS}")
    return count


def main(argv: list[str] | None = None) -> int:
    """The command's exit status. A reader that closed the pipe early (`r1 runs | head`) ends
    it quietly, as Python's documentation of SIGPIPE recommends: what is left to print goes to
    /dev/null, and the exit status is 1, with no traceback."""
    try:
        status = command(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe is only reported
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return status


def command(argv: list[str] | None) -> int:
    settle_process()  # before anything imports torch: its OpenMP runtime reads it at load
    args = _parser().parse_args(argv)
    if PUT_FIRST is not None:
        print(PUT_FIRST, file=sys.stderr)
    if args.state_dir is not None and not args.state_dir.strip():
        print(f"r1 {args.command}: --state-dir is empty; name a folder", file=sys.stderr)
        return 2
    if args.command == "lineage":  # reads the state folder, never creates one
        from cli.lineage import lineage_command

        return lineage_command(args.model, args.state_dir, args.json)
    if args.command == "runs":  # ask the Prefect server of `scripts/serve.sh`
        from cli.runs import runs_command

        return runs_command(args.state_dir, args.states, args.limit)
    if args.command == "watch":
        from cli.watch import watch_command

        return watch_command(args.state_dir, args.flow_run_id)
    shell = dict(os.environ)  # as the user's shell set it
    paths = prepare_environment(args.state_dir, create=False)  # a refused run touches nothing
    from storage.paths import StateFolderError

    try:
        paths.check_makeable()
    except StateFolderError as err:
        print(f"r1: {err}", file=sys.stderr)
        return 2
    from configs.preflight import MissingInputsError, check_inputs
    from configs.profiles import ConfigError, load_profile, profile_path

    try:
        config = load_profile(args.profile, args.overrides)
    except ConfigError as err:
        print(f"r1: {err}", file=sys.stderr)
        return 2
    if args.command == "config":
        print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    flow_name = getattr(args, "flow", "r1_pipeline")
    from rewards.registry import RewardParamsError, check_reward_params
    from tasks.plan import FaultStageError, check_fault_stage

    try:  # a fault asked for fires in a stage the flow runs; each reward takes its params
        check_fault_stage(config, flow_name)
        check_reward_params({k: v.rewards for k, v in config.grpo_stages().items()})
    except (FaultStageError, RewardParamsError) as err:
        print(f"r1: {err}", file=sys.stderr)
        return 2
    try:  # the profile's local checkpoints and data files, before anything starts
        check_inputs(config, flow_name, str(profile_path(args.profile)))
    except MissingInputsError as err:
        print(f"r1: {err}", file=sys.stderr)
        return 3
    from models.checkpoint import CheckpointError, check_model_inputs

    try:  # each checkpoint's tokenizer, template and weight files (no weights loaded)
        check_model_inputs(config, flow_name, str(profile_path(args.profile)))
    except CheckpointError as err:
        print(f"r1: {err}", file=sys.stderr)
        return 3
    from configs.sizes import PlanSizeError, check_plan_sizes
    from problems.fit import DataFitError, check_data_fit

    try:  # what the data holds can feed the stages asked for, at sizes the machine can hold
        check_data_fit(config, flow_name)
        check_plan_sizes(config)
    except (DataFitError, PlanSizeError) as err:
        print(f"r1: {err}", file=sys.stderr)
        return 2
    from training.memory_fit import MemoryFitError, check_memory_fit

    if args.command == "config" and args.gpu_gib:
        print_memory_fits(config, args.gpu_gib)
    try:  # the training stages fit the GPU found here (or the size asked for)
        total = int(args.gpu_gib * 2**30) if getattr(args, "gpu_gib", None) else None
        check_memory_fit(config, str(profile_path(args.profile)), total)
    except MemoryFitError as err:
        print(f"r1: {err}", file=sys.stderr)
        return 3
    if args.command == "config":
        return 0
    from training.disk_fit import DiskRoomError, check_disk_room

    try:  # a pretraining or SFT stage fits the free space of the state folder's disk
        check_disk_room(config, paths.root, str(profile_path(args.profile)))
    except DiskRoomError as err:
        print(f"r1: {err}", file=sys.stderr)
        return 3

    from storage.tracking import check_wait_settings

    try:  # the stores' waits from the environment, and the state folder, before anything starts
        check_wait_settings()
        paths.ensure()
        paths.check_writable()  # before Prefect's server starts on its database there
    except ValueError as err:
        print(f"r1: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"r1: state folder {paths.root}: cannot be made: {err}", file=sys.stderr)
        return 2
    from cli.prefect_api import PrefectApiUnreachable, reported_to

    try:  # a Prefect server that PREFECT_API_URL names answers (Prefect makes its home here)
        reporting = reported_to()
    except PrefectApiUnreachable as err:
        print(f"r1: {err}", file=sys.stderr)
        return 2
    show_logs()
    unused = unused_mlflow_settings(paths, os.environ) + unused_result_settings(shell, paths)
    for line in unused + ([reporting] if reporting else []):
        logging.getLogger("cli.environment").info(line)
    from cli.prefect_server import EarlyServer

    server = EarlyServer.start(paths.prefect_home)  # comes up while the code below imports
    from rich.console import Console

    from cli.table import print_report
    from flows import load_stage_code
    from storage.tracking import tracking_client
    from tasks.pipeline import run_url

    if args.flow == "r1_zero":
        from flows.r1_zero import r1_zero as flow
    else:
        from flows.r1_pipeline import r1_pipeline as flow
    load_stage_code()

    if server is not None:
        server.wait()
    stop_on_termination()
    try:
        result = flow(config=config)
    except KeyboardInterrupt as stop:
        signum = stop.signum if isinstance(stop, Terminated) else signal.SIGINT
        print(f"r1: stopped by {signum.name}: the flow run is marked crashed", file=sys.stderr)
        return 128 + signum
    except Exception as error:  # its traceback is in the run's log above, once
        from cli.failures import run_failure_line

        print(run_failure_line(error, paths.root), file=sys.stderr)
        return 1
    console = Console()
    print_report(console, result, config.evaluation.k)
    experiment = tracking_client(paths).get_run(result.parent_run_id).info.experiment_id
    print_whole(
        console, where_lines(paths, result.parent_run_id, run_url(experiment, result.parent_run_id))
    )
    return 0


def print_whole(console: Any, lines: list[str]) -> None:
    """Each line as it is: no folds put in at the terminal's width, no markup read in it."""
    for line in lines:
        console.print(line, soft_wrap=True, markup=False, highlight=False)


def where_lines(paths: StatePaths, run_id: str, url: str) -> list[str]:
    """Where a finished run's records are, each on one line (a terminal narrower than a path
    folds it, a copy keeps it whole), the command to paste as typed at the project's root, its
    path quoted for the shell."""
    ui = f"{command_path('mlflow')} ui --backend-store-uri {shlex.quote(paths.tracking_uri)}"
    return [
        f"state folder:   {paths.root}",
        f"DuckDB:         {paths.duckdb}",
        f"MLflow run:     {run_id}",
        f"MLflow UI:      {ui}",
        f"  then open     {url}",
    ]


def show_logs() -> None:
    """Log lines on stderr with their time and logger; a failure's traceback once (the task run,
    its flow run and Prefect's engine each log it), its project frames only."""
    logging.basicConfig(level=logging.INFO)  # before importing Prefect, which adds its handler
    from tasks.progress import TaskNamedFormatter

    for handler in logging.getLogger().handlers:
        handler.setFormatter(TaskNamedFormatter("%(asctime)s %(name)s %(message)s"))
    for noisy in ("httpx", "alembic", "mlflow.store"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def print_memory_fits(config, gpu_gib: float) -> None:
    """Each GPU training stage's estimated peak against a GPU of `gpu_gib` GiB."""
    from training.memory_fit import memory_fits

    for fit in memory_fits(config, int(gpu_gib * 2**30)):
        verdict = "fits" if fit.fits else "does not fit"
        print(f"{fit.key}: {fit.lines[0]}, {verdict} in {fit.capacity / 2**30:.1f} GiB usable")
        print("\n".join(f"  {line.strip()}" for line in fit.lines[1:]))
        print("\n".join(f"  fits with: {advice}" for advice in fit.advice))


SIGNAL_AGAIN_S = 0.05  # a dropped stop's signal is sent again this long after the drop


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the process is, as Ctrl-C's KeyboardInterrupt is."""

    def __init__(self, signum: signal.Signals):
        super().__init__(f"stopped by {signum.name}")
        self.signum = signum


def stop_on_termination() -> None:
    """End `r1 run` on SIGTERM and SIGHUP as on Ctrl-C, rather than dying where it stands: the
    open MLflow runs close as failed, Prefect marks the flow run crashed, and the exit handlers
    stop the temporary Prefect server this process started (which would else stay, orphaned,
    holding its port).

    A signal the run was started with ignored stays ignored: under `nohup` a closed terminal's
    SIGHUP must not stop a run of many hours.

    Python runs the handler wherever the main thread is, a finalizer (`__del__`, a weak
    reference's callback) included, where what it raises is printed and dropped: the run would
    go on as if no signal had come. A stop dropped there (`Terminated`, or Ctrl-C's
    KeyboardInterrupt) is sent again, by the same signal, 50 ms later."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise Terminated(signal.Signals(signum))

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, interrupt)
    sys.unraisablehook = raise_dropped_termination(sys.unraisablehook)


def raise_dropped_termination(
    hook: Callable[[Any], object],
) -> Callable[[Any], object]:
    """`hook` (Python's report of an exception it could not raise), sending a dropped stop's
    signal again instead of reporting it: from another thread, a moment later, so that the main
    thread takes it after the report, not inside it."""

    def report(unraisable: Any) -> None:
        stop = unraisable.exc_value
        if isinstance(stop, KeyboardInterrupt):
            signum = stop.signum if isinstance(stop, Terminated) else signal.SIGINT
            again = threading.Timer(SIGNAL_AGAIN_S, os.kill, args=(os.getpid(), signum))
            again.daemon = True
            again.start()
        else:
            hook(unraisable)

    return report


if __name__ == "__main__":
    sys.exit(main())
