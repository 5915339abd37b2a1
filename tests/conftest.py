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


# ---- several workers (tests/workers.py) ---------------------------------------------------------

ROOM_FOLDER = pytest.StashKey[str]()  # the controller's: where the room's locks are
ROOM = pytest.StashKey["Room"]()  # a worker's


def pytest_configure(config: pytest.Config) -> None:
    """The controller of a run on several workers makes the room's folder; each worker opens
    the room it names."""
    from tests.workers import ROOM_KEY, Room, new_room_folder

    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and ROOM_KEY in workerinput:
        config.stash[ROOM] = Room(workerinput[ROOM_KEY])
    elif workerinput is None and config.getoption("numprocesses", None):  # xdist's -n
        config.stash[ROOM_FOLDER] = new_room_folder()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist's hook, in the controller: tell a worker where the room is."""
    from tests.workers import ROOM_KEY

    node.workerinput[ROOM_KEY] = node.config.stash[ROOM_FOLDER]


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests.workers import remove_room_folder

    if ROOM_FOLDER in config.stash:
        remove_room_folder(config.stash[ROOM_FOLDER])


# tests sharing a fixture wider than a module: one worker runs them all, and the fixture once
PACKAGE_GROUPS = ("tests/cluster",)  # the two-node Ray cluster (tests/cluster/conftest.py)


def scope_of(nodeid: str) -> str:
    """The unit of work a test goes to a worker in: its module, or a folder of
    `PACKAGE_GROUPS` it is in."""
    module = nodeid.split("::", 1)[0]
    return next((group for group in PACKAGE_GROUPS if module.startswith(group + "/")), module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's hook, for `--dist loadscope` (as scripts/test.sh runs it): its scheduling, each
    module's tests to one worker (its module fixtures made once), with the folders of
    `PACKAGE_GROUPS` whole. (xdist's `loadgroup` marks do not reach its scheduler under pytest 9:
    it renames a test by an attribute pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ByModule(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """On a worker, each test (its fixtures' set-up and teardown too) in the room: shared, or
    to itself for a test marked `alone`."""
    room = item.config.stash.get(ROOM, None)
    if room is None:
        return (yield)
    with room.enter(alone=item.get_closest_marker("alone") is not None):
        return (yield)


# Fixtures shared by several rooms. Imports stay inside them, so that collecting a room that
# does not use them loads no model library.


@pytest.fixture(scope="module")
def tokenizer():
    """The byte-level test tokenizer (tests/tiny_models.py), one per module: some tests change
    its padding side or special tokens."""
    from tests.tiny_models import make_tokenizer

    return make_tokenizer()


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """A temporary Prefect API server (Prefect's test harness, tests/prefect_harness.py) for the
    module's flow runs, whose persisted results go to a folder of the test session's, not to
    ~/.prefect/storage, where they would outlive it."""
    from prefect.settings import PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings

    from tests.prefect_harness import prefect_harness

    results = tmp_path_factory.mktemp("prefect-results")
    with temporary_settings({PREFECT_RESULTS_LOCAL_STORAGE_PATH: results}), prefect_harness():
        yield


@pytest.fixture
def code_version(monkeypatch):
    """Sets the code version that stage keys and pipeline runs see (tasks.stage_cache), as an
    edit of the project's code would change it: `code_version("v2")`."""
    import sys

    from tasks import stage_cache

    original, current = stage_cache.code_version, {}
    for module in list(sys.modules.values()):
        # the module's own names only: a lazy module's __getattr__ (transformers') would import
        # whatever the name might mean
        if getattr(module, "__dict__", {}).get("code_version") is original:
            monkeypatch.setattr(module, "code_version", lambda: current["version"])
    return lambda version: current.update(version=version)


@pytest.fixture
def private_environment(monkeypatch):
    """A copy of the process environment for one test: `r1` points the environment at its state
    folder, which must not leak into the next test. Use with
    `pytestmark = pytest.mark.usefixtures("private_environment")`."""
    monkeypatch.setattr(os, "environ", os.environ.copy())


@pytest.fixture
def fused_middle_calls(monkeypatch) -> list[str]:
    """The names of the fused head's middles (training/fused_head.py) the chunked head calls
    in this test, each still the real compiled one."""
    import training.logits
    from training.fused_head import compiled

    calls: list[str] = []

    def counting(middle):
        def call(*args):
            calls.append(middle.__name__)
            return compiled(middle)(*args)

        return call

    monkeypatch.setattr(training.logits, "compiled", counting)
    return calls
