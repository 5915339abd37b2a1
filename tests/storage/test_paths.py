"""The state folder's own identity (`StatePaths.identity`), which stage keys carry."""

import os
import shutil
import threading
from pathlib import Path

from storage.paths import StatePaths


def test_a_folder_keeps_one_identity_and_a_folder_made_again_gets_another(tmp_path):
    paths = StatePaths(tmp_path / "state")
    assert paths.identity() is None  # no folder, nothing made
    assert not paths.root.exists()
    first = paths.ensure().identity()
    assert first and paths.identity() == first == StatePaths(paths.root).ensure().identity()
    shutil.rmtree(paths.root)
    assert paths.ensure().identity() not in (None, first)


def made_at_once(paths: StatePaths, callers: int) -> list[str | None]:
    """`paths.identity()` from `callers` threads released together."""
    start, ids = threading.Barrier(callers), []

    def make() -> None:
        start.wait()
        ids.append(paths.identity())

    threads = [threading.Thread(target=make) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ids


def test_callers_making_it_at_once_agree(tmp_path):
    for attempt in range(20):
        paths = StatePaths(tmp_path / f"state{attempt}")
        paths.root.mkdir()
        ids = made_at_once(paths, 8)
        assert len(ids) == 8 and len(set(ids)) == 1 and ids[0], ids
        assert os.listdir(paths.root) == ["state_id"]  # no draft left behind


def test_one_who_finds_none_then_loses_the_race_takes_the_winners(tmp_path, monkeypatch):
    paths = StatePaths(tmp_path / "state").ensure()
    winner = paths.identity()
    read = Path.read_text
    calls = []

    def first_read_finds_nothing(self: Path, *args, **kwargs) -> str:
        calls.append(self)
        if len(calls) == 1:
            raise FileNotFoundError(self)
        return read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", first_read_finds_nothing)
    assert paths.identity() == winner
    assert sorted(os.listdir(paths.root)) == sorted(["state_id", "mlartifacts", "prefect", "runs"])


def test_a_folder_that_held_stages_before_keeps_its_keys(tmp_path):
    """A state folder from before identities: its stages' keys stay as they were (no id in
    them), so its finished stages stay finished and `cache.keep_finished` finds them."""
    from tasks.context import RunContext

    for earlier in ("stage_keys", "runs/cold_start_sft"):
        root = tmp_path / earlier.replace("/", "-")
        (root / earlier).mkdir(parents=True)
        context = RunContext(root, "parent", "flow-run", "r1-test")
        assert context.stage_identity() == {"state": str(root)}
        assert StatePaths(root).ensure().identity() is None
        assert (root / "state_id").read_text() == ""
    fresh = StatePaths(tmp_path / "fresh").ensure()
    context = RunContext(fresh.root, "parent", "flow-run", "r1-test")
    assert context.stage_identity() == {"state": str(fresh.root), "state_id": fresh.identity()}
