"""Process settings that must be in place before Prefect, MLflow or transformers are imported."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote

from storage.paths import STATE_ENV, StatePaths

OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def prepare_environment(state_dir: str | Path | None = None, create: bool = True) -> StatePaths:
    """Point every store at the state folder and keep the process offline. With `create`
    False the folder is only named: a command that may still refuse (a bad profile) creates
    it once it has accepted, by `paths.ensure()`."""
    if state_dir is not None:
        os.environ[STATE_ENV] = str(Path(state_dir).resolve())
    paths = StatePaths.from_env()
    if create:
        paths.ensure()
    os.environ[STATE_ENV] = str(paths.root)
    os.environ.setdefault("PREFECT_HOME", str(paths.prefect_home))
    for name in RESULT_PATH_SETTINGS:  # the stage cache in Prefect's home, whatever the shell says
        os.environ[name] = str(results_folder(os.environ))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # the temporary server of a run without PREFECT_API_URL may take more than Prefect's default
    # 20 s to start on a busy 2-core machine
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("MLFLOW_TRACKING_URI", paths.tracking_uri)
    os.environ.setdefault("MLFLOW_SKIP_PIP_REQUIREMENTS_CHECK", "true")
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    name_deepspeed_accelerator()
    return paths


# Prefect's settings (either name) for where task results are persisted: the stage cache stays
# in Prefect's home, `prefect/storage` of the state folder (or of a PREFECT_HOME set elsewhere)
RESULT_PATH_SETTINGS = ("PREFECT_RESULTS_LOCAL_STORAGE_PATH", "PREFECT_LOCAL_STORAGE_PATH")


def results_folder(environ: Mapping[str, str]) -> Path:
    """Where the stage cache (Prefect's persisted task results) is kept: `storage` in Prefect's
    home, Prefect's own default."""
    return Path(environ["PREFECT_HOME"]) / "storage"


def unused_result_settings(shell: Mapping[str, str], paths: StatePaths) -> list[str]:
    """A line for each setting of the shell (`shell`: the environment before `prepare_environment`)
    that would have moved the stage cache out of Prefect's home: a run from a shell without it
    would find none of the stages finished, and compute them all again."""
    home = {"PREFECT_HOME": shell.get("PREFECT_HOME") or str(paths.prefect_home)}
    folder = results_folder(home)
    return [
        f"prefect: {name}={shell[name]} is not used: the stage cache stays in {folder}"
        for name in RESULT_PATH_SETTINGS
        if shell.get(name) and Path(shell[name]).resolve() != folder.resolve()
    ]


# MLflow's settings that name a store; the pipeline's runs and models go to the state folder's
MLFLOW_STORE_SETTINGS = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


def same_store(uri: str, paths: StatePaths) -> bool:
    """Whether `uri` names the state folder's MLflow store (`sqlite:///` and its path, however
    spelled: relative, or through a symlink)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return False
    return Path(unquote(uri.removeprefix(prefix))).resolve() == paths.mlflow_db.resolve()


def unused_mlflow_settings(paths: StatePaths, environ: Mapping[str, str]) -> list[str]:
    """A line for each MLflow setting of the shell that names another store than the state
    folder's: the pipeline's runs and models never go there, and a user who set it would look
    for them in the wrong place."""
    return [
        f"mlflow: {name}={environ[name]} is not used: the run's runs and models go to the state "
        f"folder's store, {paths.tracking_uri}"
        for name in MLFLOW_STORE_SETTINGS
        if environ.get(name) and not same_store(environ[name], paths)
    ]


def name_deepspeed_accelerator() -> None:
    """Tell DeepSpeed, when it is installed and there is no CUDA device, that the accelerator is
    the CPU: transformers imports it with every model, and it otherwise warns in each process
    that it guessed."""
    if "DS_ACCELERATOR" in os.environ or importlib.util.find_spec("deepspeed") is None:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
