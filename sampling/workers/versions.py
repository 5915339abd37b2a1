"""Policy versions as files: the trainer writes its weights after each update into a folder (the
stage's, on the shared state folder when workers run on other machines), one file per version
with its content digest; a worker loads the version a job names and checks the digest first.

Version v is the policy after v steps (a step that trained no sample leaves the weights as they
were, and its version names the same file). A worker that reads another file than the trainer
wrote (another folder at that path, a file cut short) fails naming both digests instead of
sampling from the wrong weights.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)


class VersionMismatchError(RuntimeError):
    """A version file that is missing or whose bytes do not digest as the trainer's did."""


@dataclass(frozen=True)
class PolicyVersion:
    number: int
    path: str  # the weights file (a state dict saved with torch.save)
    digest: str  # sha256 of the file's bytes


class VersionFolder:
    """The trainer's side: `publish(model, number)` writes a version; `release(below)` removes the
    files no version from `below` on uses. The folder is emptied when opened: versions of an
    earlier attempt are never read (a resumed run publishes its checkpoint's weights again)."""

    def __init__(self, folder: Path):
        self.folder = folder
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        self.versions: dict[int, PolicyVersion] = {}

    def publish(self, model: torch.nn.Module, number: int, changed: bool = True) -> PolicyVersion:
        """Version `number` of `model`'s weights; unchanged since the last version (`changed`
        False), it names the last version's file."""
        last = self.versions.get(number - 1)
        if not changed and last is not None:
            version = PolicyVersion(number, last.path, last.digest)
        else:
            version = self._write(model, number)
        self.versions[number] = version
        return version

    def _write(self, model: torch.nn.Module, number: int) -> PolicyVersion:
        path = self.folder / f"v{number:06d}.pt"
        state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # a reader sees the whole file or none
        return PolicyVersion(number, str(path), hashlib.sha256(data).hexdigest())

    def release(self, below: int) -> None:
        """Forget the versions before `below` and remove files only they named."""
        for number in [n for n in self.versions if n < below]:
            gone = self.versions.pop(number)
            if all(v.path != gone.path for v in self.versions.values()):
                Path(gone.path).unlink(missing_ok=True)


def read_version(version: PolicyVersion) -> dict[str, torch.Tensor]:
    """The state dict of `version`, after its bytes were checked against its digest."""
    path = Path(version.path)
    if not path.is_file():
        raise VersionMismatchError(
            f"policy version {version.number}: no file at {path}. Workers on other machines need "
            "the state folder on a filesystem they all see at the same path (docs/cluster.md)"
        )
    data = path.read_bytes()
    found = hashlib.sha256(data).hexdigest()
    if found != version.digest:
        raise VersionMismatchError(
            f"policy version {version.number}: {path} has digest {found[:12]}, the trainer wrote "
            f"{version.digest[:12]}: this worker sees another file at that path"
        )
    return torch.load(io.BytesIO(data), weights_only=True)
