"""Stage 2 (and later SFT stages): supervised fine-tuning with the loss on completions only.

`config.engine` picks where it trains: in this process (`single`) or under DeepSpeed ZeRO in
worker processes that this stage launches (`deepspeed`, training.distributed).
"""

from __future__ import annotations

from pathlib import Path

from cluster.placement import training_nodes
from configs.cluster import ClusterConfig
from configs.supervised import SFTConfig
from models.loading import load_model, load_tokenizer
from models.saved import ModelRef, save_model
from stages.fingerprint import fingerprint
from stages.tracker import Tracker
from training.distributed import WorkerSpec, require_deepspeed, run_workers
from training.examples import dataset_examples
from training.supervised import train


def run(
    config: SFTConfig,
    base: ModelRef,
    dataset_path: Path,
    out_dir: Path,
    tracker: Tracker,
    desc: str = "sft",
    cluster: ClusterConfig | None = None,
) -> ModelRef:
    """Fine-tune `base` on a saved dataset with `question` and `completion` columns; under
    DeepSpeed, over `cluster.nodes` machines when a cluster says so."""
    if config.engine.kind == "deepspeed":
        return run_deepspeed(config, base, dataset_path, out_dir, tracker, desc, cluster)
    tokenizer = load_tokenizer(base.path)
    model = load_model(base.path)
    examples = dataset_examples(tokenizer, dataset_path, config.train.max_length)
    examples.cuts.report(tracker.log_metrics, desc)
    report = train(
        model,
        examples,
        config.train,
        out_dir / "checkpoints",
        fingerprint(config, base.path, dataset_path, len(examples)),
        tracker.log_metrics,
        pad_id=tokenizer.pad_token_id,
        desc=desc,
        engine_config=config.engine,
    )
    tracker.log_metrics(
        {"train/tokens_per_second": report.tokens_per_second, "train/steps": report.steps}
    )
    return save_model(model, tokenizer, out_dir)


def run_deepspeed(
    config: SFTConfig,
    base: ModelRef,
    dataset_path: Path,
    out_dir: Path,
    tracker: Tracker,
    desc: str = "sft",
    cluster: ClusterConfig | None = None,
) -> ModelRef:
    """The same fine-tuning under DeepSpeed ZeRO in `config.engine.processes` worker processes
    (split over `cluster.nodes` machines); the model lands where `run` saves it, and a stopped
    run resumes from its last checkpoint."""
    require_deepspeed()
    examples = dataset_examples(load_tokenizer(base.path), dataset_path, config.train.max_length)
    examples.cuts.report(tracker.log_metrics, desc)  # the workers build the same examples
    out_dir = out_dir.resolve()  # the workers may start in another folder
    spec = WorkerSpec(
        desc=desc,
        base=str(base.path.resolve()),
        dataset=str(dataset_path.resolve()),
        config=config.model_dump(mode="json"),
        out_dir=str(out_dir),
        run_dir=str(out_dir / "deepspeed"),
        fingerprint=fingerprint(config, base.path, dataset_path),
    )
    result = run_workers(spec, config.engine, tracker.log_metrics, training_nodes(cluster))
    tracker.log_metrics(
        {"train/tokens_per_second": result["tokens_per_second"], "train/steps": result["steps"]}
    )
    return ModelRef(path=out_dir / "model", parameters=int(result["parameters"]))
