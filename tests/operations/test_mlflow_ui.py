"""The MLflow UI shows a registered model's lineage, served on loopback, in headless Chromium.

A real store is built with the project's own tracking helpers (a pipeline run, a nested stage run
with a dataset input and a model registered as `r1-micro@final`), `mlflow server` serves it, and
Chromium renders the model version page and the stage run's page: screenshots are saved (under
pytest's temporary folder, and copied to `$R1_SCREENSHOT_DIR` when set) and the rendered DOM is
checked for the model, its source run and the dataset. Skips when Chromium is missing
(`bash scripts/browser.sh` installs it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from storage.paths import StatePaths
from storage.tracking import (
    alias_for,
    experiment_id,
    finish_run,
    log_dataset,
    register_model,
    stage_run,
    start_pipeline_run,
    tracking_client,
)

# Heavy: an MLflow server and headless Chromium.
pytestmark = pytest.mark.heavy

MODEL = "r1-micro"
STAGE = "all_scenarios_rl"
DATASET = "rejection-kept"
PIPELINE_RUN = "pipeline"
WINDOW = (1800, 1200)  # wide enough that the version page's header fields do not wrap
VIRTUAL_TIME_MS = 15000
SCREENSHOT_ENV = "R1_SCREENSHOT_DIR"

# Headless Chromium on a machine with no network and no display, started as root.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]


@dataclass(frozen=True)
class Lineage:
    """What the store holds: the stage run that produced the registered model version."""

    paths: StatePaths
    experiment_id: str
    parent_run_id: str
    run_id: str
    version: str
    dataset_digest: str


@dataclass(frozen=True)
class Ui:
    url: str
    lineage: Lineage
    shots: Path


def find_chromium() -> str | None:
    found = shutil.which("chromium")
    if found:
        return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def build_store(root: Path) -> Lineage:
    """A pipeline run with one stage that reads a dataset and registers its model."""
    paths = StatePaths(root).ensure()
    client = tracking_client(paths)
    experiment = experiment_id(client, MODEL, paths)
    parent = start_pipeline_run(client, experiment, PIPELINE_RUN, "flow-ui", {"profile": "micro"})
    data = root / "kept.jsonl"
    data.write_text('{"prompt": "2+3", "completion": "<answer>5</answer>"}\n')
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    model_dir = root / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    (model_dir / "model.safetensors").write_bytes(b"\0" * 256)
    with stage_run(client, parent, STAGE, {"learning_rate": 1e-5}) as tracker:
        log_dataset(client, tracker.run_id, DATASET, digest, data, "train", 1)
        version = register_model(client, tracker.run_id, model_dir, MODEL, alias_for(STAGE))
    finish_run(client, parent)
    return Lineage(paths, experiment, parent, tracker.run_id, str(version), digest[:36])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def mlflow_command() -> list[str]:
    script = Path(sys.executable).parent / "mlflow"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mlflow"]


def start_server(paths: StatePaths, port: int, log_file: Path) -> subprocess.Popen[bytes]:
    """`mlflow server` on loopback, one worker, no job runner; in its own process group."""
    command = mlflow_command() + [
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        paths.tracking_uri,
        "--default-artifact-root",
        paths.mlflow_artifacts.as_uri(),
    ]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with log_file.open("wb") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def stop_server(server: subprocess.Popen[bytes]) -> None:
    """Ends the server and the workers it started (they share its process group)."""
    if server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=5)


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def wait_healthy(url: str, server: subprocess.Popen[bytes], log_file: Path, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow server exited with {server.returncode}:\n{tail(log_file)}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    pytest.fail(f"mlflow server not healthy after {limit:.0f}s:\n{tail(log_file)}")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def render(chromium: str, url: str, target: Path) -> str:
    """Opens `url` in headless Chromium with a fresh profile, saves a screenshot to `target` and
    returns the DOM as rendered (after the page's requests have settled in virtual time)."""
    command = [
        chromium,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={target.with_suffix('.profile')}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--virtual-time-budget={VIRTUAL_TIME_MS}",
        f"--screenshot={target}",
        "--dump-dom",
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"chromium failed ({done.returncode}):\n{done.stderr[-3000:]}"
    keep = os.environ.get(SCREENSHOT_ENV)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy2(target, Path(keep) / target.name)
    return done.stdout


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header; fails on anything that is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def assert_rendered(path: Path) -> None:
    """A real page, not a blank one: the window's size and more bytes than a plain PNG needs."""
    assert png_size(path) == WINDOW
    assert path.stat().st_size > 30_000, f"{path} is {path.stat().st_size} bytes: a blank page?"


@pytest.fixture(scope="module")
def chromium() -> str:
    found = find_chromium()
    if found is None:
        pytest.skip("chromium is not installed (bash scripts/browser.sh installs Debian's)")
    return found


@pytest.fixture(scope="module")
def ui(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    root = tmp_path_factory.mktemp("mlflow-ui")
    lineage = build_store(root / "state")
    port = free_port()
    log_file = root / "server.log"
    server = start_server(lineage.paths, port, log_file)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server, log_file, limit=90)
        shots = root / "screenshots"
        shots.mkdir()
        yield Ui(url, lineage, shots)
    finally:
        stop_server(server)


def test_rest_api_serves_the_final_alias_and_its_run(ui: Ui) -> None:
    found = get_json(f"{ui.url}/api/2.0/mlflow/registered-models/alias?name={MODEL}&alias=final")
    version = found["model_version"]
    assert version["version"] == ui.lineage.version == "1"
    assert version["run_id"] == ui.lineage.run_id
    assert "final" in version["aliases"]
    run = get_json(f"{ui.url}/api/2.0/mlflow/runs/get?run_id={ui.lineage.run_id}")["run"]
    assert run["info"]["run_name"] == STAGE
    tags = {tag["key"]: tag["value"] for tag in run["data"]["tags"]}
    assert tags["mlflow.parentRunId"] == ui.lineage.parent_run_id
    inputs = run["inputs"]["dataset_inputs"]
    assert [item["dataset"]["name"] for item in inputs] == [DATASET]
    assert inputs[0]["dataset"]["digest"] == ui.lineage.dataset_digest


def test_model_version_page_shows_its_source_run(ui: Ui, chromium: str) -> None:
    url = f"{ui.url}/#/models/{MODEL}/versions/{ui.lineage.version}"
    dom = render(chromium, url, ui.shots / "model_version.png")
    assert_rendered(ui.shots / "model_version.png")
    assert MODEL in dom
    assert ui.lineage.run_id in dom  # the source run's link
    assert STAGE in dom  # the source run's name


def test_stage_run_page_shows_dataset_parent_and_model(ui: Ui, chromium: str) -> None:
    lineage = ui.lineage
    url = f"{ui.url}/#/experiments/{lineage.experiment_id}/runs/{lineage.run_id}"
    dom = render(chromium, url, ui.shots / "stage_run.png")
    assert_rendered(ui.shots / "stage_run.png")
    assert DATASET in dom and lineage.dataset_digest in dom
    assert PIPELINE_RUN in dom  # the parent run
    assert MODEL in dom  # the registered model this run produced
