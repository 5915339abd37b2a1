"""Preflight: room on the state folder's disk for a pretraining or SFT stage, before anything runs.

Such a stage holds at once, in its folder and the MLflow store: its last checkpoint and the one
being written beside it (fp32 weights and AdamW's two moments: 12 bytes a parameter each),
the model it saves and MLflow's copy of it (4 bytes a parameter each): 32 bytes a
parameter of the largest model the run trains. The stores take some more as a run starts
(Prefect's database, copied in, about 6 MiB; MLflow's, with its write-ahead log of up to 4 MiB;
DuckDB's): STORES_BYTES, less what they hold already. A disk with less free than that fails at
the start, or at the first checkpoint or saved model, so such a run is refused before it starts,
naming the folder, the space and the need. It is the least a run needs, not what the whole run
keeps: every stage keeps its model and checkpoints, a GRPO stage under the RL guard keeps those
its rules may roll back to besides (tiny's `reasoning_rl` folder holds 7 checkpoints, 78 MiB),
the micro profile's state folder ends at about 22 MiB, the tiny profile's at about 365 MiB; a run
that fills the disk later stops in one line saying so (storage/disk.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from configs.schema import PipelineConfig
from storage.disk import disk_space, size_text
from storage.paths import StatePaths
from training.memory import ModelShape
from training.memory_fit import model_shape

STAGE_BYTES_PER_PARAMETER = 32  # two checkpoints (12 bytes each), the saved model and its copy
STORES_BYTES = 16 << 20  # Prefect's, MLflow's (its write-ahead log too), DuckDB's, as a run starts


class DiskRoomError(ValueError):
    """The state folder's disk has less free space than a pretraining or SFT stage needs."""


def trained_models(config: PipelineConfig) -> dict[str, ModelShape]:
    """The models a run trains, by the setting that names each: the policy's base and each
    student (a checkpoint's shape from its config.json, else the profile's model spec)."""
    boot = config.bootstrap
    vocab = boot.vocab_size
    found = {"bootstrap": model_shape(boot.path, boot.model, vocab)}
    for i, student in enumerate(config.distillation.students):
        found[f"distillation.students.{i}"] = model_shape(
            student.path, student.model or boot.model, vocab
        )
    return found


@dataclass(frozen=True)
class DiskRoom:
    """What a pretraining or SFT stage of a run needs free on the state folder's disk."""

    key: str  # the setting of the largest model the run trains
    parameters: int
    stage: int  # bytes: its checkpoints, saved model and MLflow's copy
    stores: int  # bytes the stores are yet to take of STORES_BYTES

    @property
    def need(self) -> int:
        return self.stage + self.stores


def disk_room_needed(config: PipelineConfig, root: Path) -> DiskRoom:
    """The room a pretraining or SFT stage of `config` needs in the state folder `root`: the stores'
    part less what they hold there already."""
    key, shape = max(trained_models(config).items(), key=lambda item: item[1].parameters)
    stores = max(0, STORES_BYTES - stores_bytes(StatePaths(root)))
    stage = shape.parameters * STAGE_BYTES_PER_PARAMETER
    return DiskRoom(key, shape.parameters, stage, stores)


def stores_bytes(paths: StatePaths) -> int:
    """The bytes the stores hold in the state folder now: Prefect's home, MLflow's database and
    DuckDB's (with their logs); 0 for a folder not made yet."""
    files = [paths.mlflow_db, paths.duckdb]
    files += [path.with_name(path.name + end) for path in files for end in ("-wal", ".wal")]
    if paths.prefect_home.is_dir():
        files += [path for path in paths.prefect_home.rglob("*") if path.is_file()]
    return sum(path.stat().st_size for path in files if path.is_file())


def check_disk_room(config: PipelineConfig, root: Path, source: str) -> None:
    """Raise DiskRoomError when the disk of the state folder `root` (or of the folder it would be
    made in) has less free space than a pretraining or SFT stage of `config` needs."""
    space = disk_space(root)
    room = disk_room_needed(config, root)
    if space is None or space.free >= room.need:
        return
    stores = f", and {size_text(room.stores)} for the stores" if room.stores else ""
    raise DiskRoomError(
        f"{source}: the disk of the state folder {root} has {space.text()}; a pretraining or "
        f"SFT stage needs about {size_text(room.need)} ({room.key}: {room.parameters:,} "
        f"parameters x {STAGE_BYTES_PER_PARAMETER} bytes for two checkpoints, the saved model "
        f"and MLflow's copy{stores}); nothing has run: free space on that disk, or name a state "
        "folder on another (--state-dir, R1_STATE_DIR)"
    )
