"""Process settings that must be in place before Prefect, MLflow or transformers are imported."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

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


def name_deepspeed_accelerator() -> None:
    """Tell DeepSpeed, when it is installed and there is no CUDA device, that the accelerator is
    the CPU: transformers imports it with every model, and it otherwise warns in each process
    that it guessed."""
    if "DS_ACCELERATOR" in os.environ or importlib.util.find_spec("deepspeed") is None:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
