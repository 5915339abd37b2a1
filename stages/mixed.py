"""Stage 5's data (and stage 7's): SFT examples from kept rollouts, plus non-reasoning examples.

DeepSeek-R1 fine-tunes the *base* model again on about 600k reasoning samples from rejection
sampling and 200k non-reasoning samples; this builds the tiny world's version of that mix.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from datasets import Dataset, load_from_disk


def kept_examples(kept_dataset: Path) -> list[dict[str, str]]:
    rows = load_from_disk(str(kept_dataset))
    return [
        {"question": r["prompt"], "completion": r["completion"], "kind": r["kind"]} for r in rows
    ]


def general_examples(path: Path) -> list[dict[str, str]]:
    """The non-reasoning SFT set (JSONL with prompt and response)."""
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{"question": r["prompt"], "completion": r["response"], "kind": "general"} for r in rows]


def build_sft_set(
    kept_dataset: Path, general_sft: Path | None, out_dir: Path, seed: int = 0
) -> tuple[Path, dict[str, int]]:
    """Shuffle the kept rollouts and the general examples into one dataset on disk.

    Returns its folder and the number of examples of each kind.
    """
    examples = kept_examples(kept_dataset)
    if general_sft is not None:
        examples += general_examples(general_sft)
    if not examples:
        raise ValueError(
            f"{kept_dataset}: nothing to fine-tune on (every rollout was filtered out)"
        )
    random.Random(seed).shuffle(examples)
    counts: dict[str, int] = {}
    for e in examples:
        counts[e["kind"]] = counts.get(e["kind"], 0) + 1
    path = out_dir / "sft_dataset"
    Dataset.from_list(examples).save_to_disk(str(path))
    return path, counts
