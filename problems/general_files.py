"""The general (non-reasoning) sets as files: written as JSONL under a stage's folder, and
preference pairs read back (the tiny world's, or a user's own)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from configs.data import GeneralConfig
from problems.general import PreferencePair, general_problems, preference_pairs, sft_rows


def write_jsonl(path: str | Path, rows: list[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def load_pairs(path: str | Path) -> list[PreferencePair]:
    """Preference pairs from JSONL; only prompt, chosen and rejected are required (real data)."""
    pairs = []
    with Path(path).open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            missing = [k for k in ("prompt", "chosen", "rejected") if k not in row]
            if missing:
                raise ValueError(f"{path}: row {i} lacks {missing}; has {sorted(row)}")
            pairs.append(
                PreferencePair(
                    id=str(row.get("id", f"pair-{i:06d}")),
                    key=str(row.get("key", row.get("id", i))),
                    kind=str(row.get("kind", "")),
                    language=str(row.get("language", "")),
                    prompt=str(row["prompt"]),
                    chosen=str(row["chosen"]),
                    rejected=str(row["rejected"]),
                    rejection=str(row.get("rejection", "")),
                )
            )
    return pairs


@dataclass(frozen=True)
class GeneralFiles:
    sft_path: Path
    pairs_train_path: Path
    pairs_heldout_path: Path
    rl_prompts_path: Path
    eval_prompts_path: Path
    counts: dict[str, int]

    def paths(self) -> dict[str, Path]:
        return {
            "sft": self.sft_path,
            "pairs_train": self.pairs_train_path,
            "pairs_heldout": self.pairs_heldout_path,
            "rl_prompts": self.rl_prompts_path,
            "eval_prompts": self.eval_prompts_path,
        }


def write_general_sets(cfg: GeneralConfig, out_dir: Path) -> GeneralFiles:
    """Every general set as JSONL under `out_dir`; prompts files are in the problem-file format."""
    sft = sft_rows(cfg)
    train = [asdict(p) for p in preference_pairs(cfg, "train", cfg.n_pairs_train)]
    heldout = [asdict(p) for p in preference_pairs(cfg, "heldout", cfg.n_pairs_heldout)]
    rl = [p.to_dict() for p in general_problems(cfg, "train", cfg.n_rl_prompts)]
    evals = [p.to_dict() for p in general_problems(cfg, "heldout", cfg.n_eval_prompts)]
    return GeneralFiles(
        sft_path=write_jsonl(out_dir / "general_sft.jsonl", sft),
        pairs_train_path=write_jsonl(out_dir / "pairs_train.jsonl", train),
        pairs_heldout_path=write_jsonl(out_dir / "pairs_heldout.jsonl", heldout),
        rl_prompts_path=write_jsonl(out_dir / "general_rl.jsonl", rl),
        eval_prompts_path=write_jsonl(out_dir / "general_eval.jsonl", evals),
        counts={
            "sft": len(sft),
            "pairs_train": len(train),
            "pairs_heldout": len(heldout),
            "rl_prompts": len(rl),
            "eval_prompts": len(evals),
        },
    )
