import os

import pytest

# Offline and quiet before any library is imported.
for key, value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_SKIP_PIP_REQUIREMENTS_CHECK": "true",
    "TQDM_DISABLE": "1",
}.items():
    os.environ.setdefault(key, value)

# torch's threads wait without spinning, in this process and every one a test starts (set before
# torch loads; scripts/test.sh sets it before pytest starts too)
from host.threads import settle_process  # noqa: E402

settle_process()


# Fixtures shared by several rooms. Imports stay inside them, so that collecting a room that
# does not use them loads no model library.


@pytest.fixture(scope="module")
def tokenizer():
    """The byte-level test tokenizer (tests/tiny_models.py), one per module: some tests change
    its padding side or special tokens."""
    from tests.tiny_models import make_tokenizer

    return make_tokenizer()


@pytest.fixture(scope="module")
def prefect_server():
    """A temporary Prefect API server (Prefect's test harness, tests/prefect_harness.py) for the
    module's flow runs."""
    from tests.prefect_harness import prefect_harness

    with prefect_harness():
        yield


@pytest.fixture
def code_version(monkeypatch):
    """Sets the code version that stage keys and pipeline runs see (tasks.stage_cache), as an
    edit of the project's code would change it: `code_version("v2")`."""
    import sys

    from tasks import stage_cache

    original, current = stage_cache.code_version, {}
    for module in list(sys.modules.values()):
        if getattr(module, "code_version", None) is original:
            monkeypatch.setattr(module, "code_version", lambda: current["version"])
    return lambda version: current.update(version=version)


@pytest.fixture
def private_environment(monkeypatch):
    """A copy of the process environment for one test: `r1` points the environment at its state
    folder, which must not leak into the next test. Use with
    `pytestmark = pytest.mark.usefixtures("private_environment")`."""
    monkeypatch.setattr(os, "environ", os.environ.copy())
