"""Preflight: every local input a profile names, checked before anything runs.

A profile on real checkpoints (configs/gpu-qwen.yaml) needs model folders and data files that
this offline pipeline never downloads. Without this check the first missing one would surface
minutes (or GPU-hours) in, at the stage that opens it, and only that one; here all of them are
listed at once, each with its config key, where it was looked for, what is wrong with it and how
to get it. Only the file system is read (names, sizes, one small JSON file per model and the first
bytes of each weight file), so the check takes milliseconds and imports neither torch nor
transformers; models.checkpoint.check_model_inputs adds the checks that need the tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from configs.schema import PipelineConfig

SUFFIXES = (".jsonl", ".json", ".parquet")  # what problems.loader reads
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")

# What each flow opens: the whole recipe all of it; R1-Zero no students; stage 7 alone and the
# scheduled evaluation take their models from the registry.
FLOW_NEEDS: dict[str, tuple[str, ...]] = {
    "r1_pipeline": ("policy", "students", "data"),
    "r1_zero": ("policy", "data"),
    "distill": ("students", "data"),
    "evaluate_registered": ("data",),
}
MODEL_HINT = "a local folder saved with save_pretrained (config.json, tokenizer files, weights)"


def model_hint(path: Path, hub_id: str | None) -> str:
    if hub_id:
        return f"hf download {hub_id} --local-dir {path}"
    return MODEL_HINT


def data_hint(question_field: str, answer_field: str) -> str:
    return (
        f"a JSONL, JSON or Parquet file with the columns {question_field!r} and {answer_field!r} "
        "(GSM8K `#### 42` or MATH `\\boxed{42}` answers); GSM8K as JSONL: "
        "bash scripts/fetch_gpu_inputs.sh (docs/gpu.md)"
    )


@dataclass(frozen=True)
class LocalInput:
    """One path a profile needs: its config key, what it is for, and how to get it."""

    key: str  # e.g. "distillation.students[1].path"
    what: str  # e.g. "student 'llama' base"
    path: Path
    kind: Literal["model", "file"]
    how_to_get: str


@dataclass(frozen=True)
class MissingInput:
    input: LocalInput
    problems: tuple[str, ...]  # why it is not usable, e.g. ("no such folder",)


class MissingInputsError(FileNotFoundError):
    """Local inputs a profile needs are absent or unusable; the message lists every one."""

    def __init__(self, message: str, missing: list[MissingInput]):
        super().__init__(message)
        self.missing = missing


def required_inputs(config: PipelineConfig, flow: str = "r1_pipeline") -> list[LocalInput]:
    """The local paths `flow` opens under `config`; the tiny world needs none."""
    needs = FLOW_NEEDS.get(flow, ("policy", "students", "data"))
    inputs: list[LocalInput] = []
    boot = config.bootstrap
    if "policy" in needs and boot.path is not None:
        how = model_hint(boot.path, boot.hub_id)
        inputs.append(LocalInput("bootstrap.path", "the policy's base", boot.path, "model", how))
    for i, student in enumerate(config.distillation.students if "students" in needs else []):
        if student.path is not None:
            key, what = f"distillation.students[{i}].path", f"student {student.name!r} base"
            how = model_hint(student.path, student.hub_id)
            inputs.append(LocalInput(key, what, student.path, "model", how))
    files = config.data.files
    if "data" in needs and config.data.source == "files" and files is not None:
        how = data_hint(files.question_field, files.answer_field)
        for split, what, path in (
            ("train", "training problems", files.train_path),
            ("heldout", "held-out problems", files.heldout_path),
        ):
            inputs.append(LocalInput(f"data.files.{split}_path", what, path, "file", how))
    return inputs


def has_chat_template(folder: Path) -> bool:
    """A chat template saved with the tokenizer: in its own file or in tokenizer_config.json."""
    if any((folder / name).is_file() for name in CHAT_TEMPLATE_FILES):
        return True
    config = folder / "tokenizer_config.json"
    try:
        return bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def model_folder_problems(folder: Path) -> list[str]:
    """Why `folder` is not a usable model folder, from its files alone; [] when it is."""
    if not folder.exists():
        return ["no such folder"]
    if not folder.is_dir():
        return ["not a folder"]
    problems = []
    if not (folder / "config.json").is_file():
        problems.append("no config.json")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        problems.append(f"no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    elif not has_chat_template(folder):
        problems.append(
            "the tokenizer has no chat template (prompts are rendered with it): use an "
            "instruct or chat checkpoint, or save one with tokenizer.chat_template set"
        )
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        problems.append(f"no weights ({', '.join(WEIGHT_PATTERNS)})")
    return problems + weight_file_problems(folder)


LFS_POINTER = b"version https://git-lfs"
MAX_HEADER = 100 * 2**20  # safetensors' own limit on a header's length


def weight_file_problems(folder: Path) -> list[str]:
    """Weight files that cannot be weights, from their first bytes: a git-lfs pointer (a `git
    clone` without git-lfs), or a safetensors file whose header does not parse or whose tensors
    end past the file's end (an unfinished download). The header is read, never the tensors."""
    problems = []
    for path in sorted(p for pattern in WEIGHT_PATTERNS for p in folder.glob(pattern)):
        try:
            with path.open("rb") as f:
                head = f.read(len(LFS_POINTER))
                size = path.stat().st_size
                if head.startswith(LFS_POINTER):
                    problems.append(
                        f"{path.name} is a git-lfs pointer, not weights: run `git lfs pull` in "
                        "the folder, or download it with `hf download`"
                    )
                elif path.suffix == ".safetensors" and not _safetensors_whole(f, head, size):
                    problems.append(
                        f"{path.name}: truncated or not safetensors (an unfinished download?)"
                    )
        except OSError as err:
            problems.append(f"{path.name}: cannot be read ({err.strerror})")
    return problems


def _safetensors_whole(f: BinaryIO, head: bytes, size: int) -> bool:
    """The file's 8-byte header length, JSON header and tensors' offsets fit its size."""
    length = int.from_bytes(head[:8], "little") if len(head) >= 8 else size
    if 8 + length > size or length > MAX_HEADER:
        return False
    f.seek(8)
    try:
        header = json.loads(f.read(length))
        ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return False
    return 8 + length + max(ends, default=0) <= size


def data_file_problems(path: Path) -> list[str]:
    if not path.exists():
        return ["no such file"]
    if not path.is_file():
        return ["not a file"]
    if path.suffix not in SUFFIXES:
        return [f"unknown file kind {path.suffix!r}; expected one of {', '.join(SUFFIXES)}"]
    if path.stat().st_size == 0:
        return ["the file is empty"]
    return []


def missing_inputs(config: PipelineConfig, flow: str = "r1_pipeline") -> list[MissingInput]:
    missing = []
    for item in required_inputs(config, flow):
        check = model_folder_problems if item.kind == "model" else data_file_problems
        problems = check(item.path)
        if problems:
            missing.append(MissingInput(item, tuple(problems)))
    return missing


def describe(missing: list[MissingInput], source: str) -> str:
    """One message naming every missing input: key, path, where looked, what is wrong, how to
    get it."""
    lines = [f"{source}: {len(missing)} local input(s) missing or unusable; nothing has run:"]
    for m in missing:
        item = m.input
        lines += [
            f"  {item.key} = {item.path}  ({item.what})",
            f"    looked in {item.path.resolve()}: {'; '.join(m.problems)}",
            f"    get it: {item.how_to_get}",
        ]
    lines.append(
        "The pipeline runs offline and downloads nothing: fetch these on a machine with hub "
        "access (docs/gpu.md), or point the profile at local copies, e.g. "
        "--set bootstrap.path=/path/to/checkpoint"
    )
    return "\n".join(lines)


def check_inputs(
    config: PipelineConfig, flow: str = "r1_pipeline", source: str | None = None
) -> None:
    """Raise MissingInputsError listing every local input `flow` needs that is not usable."""
    missing = missing_inputs(config, flow)
    if missing:
        raise MissingInputsError(describe(missing, source or f"profile {config.name}"), missing)
