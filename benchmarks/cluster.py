"""Sampling throughput on a Ray cluster: one process, then 1 and 2 sampling actors, each with
one torch thread, on a local two-node cluster (loopback, one CPU per node), in one run.

The work is rejection sampling's: chunks of prompts, G samples each, every chunk scored by the
tiny profile's rewards (the code family's in the sandbox) and inserted into a DuckDB file by
this process as it comes back. Prints completion tokens per second of each, the scaling
efficiency at 2 actors (their throughput over twice one actor's) and the terms that bound it:
starting an actor and loading its model, and per chunk the actor's sampling time, the time an
actor stood idle (transfer, queueing, waiting on this process), the result's size and this
process's scoring and insert. docs/cluster.md turns these terms into what 4- and 32-GPU
clusters should see.

    python -m benchmarks.cluster                      # a tiny-profile-sized model, untrained
    python -m benchmarks.cluster --model state/runs/cold_start_sft/KEY/model

Without --model the model has the tiny profile's base shape and random weights, so its
completions run to --max-new-tokens and every chunk costs the same: what is measured is the
decode loop's speed, not what it says. Timings vary with load: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every address on loopback

import torch  # noqa: E402

from configs import load_profile  # noqa: E402
from configs.cluster import ClusterConfig  # noqa: E402
from contracts.reward_names import PREFERENCE  # noqa: E402
from models.chat import render_prompt  # noqa: E402
from models.loading import build_model, load_model, load_tokenizer  # noqa: E402
from models.saved import save_model  # noqa: E402
from models.tokenizer import train_tokenizer  # noqa: E402
from problems.world import split_world  # noqa: E402
from rewards.registry import RewardSet  # noqa: E402
from sampling.chunks import ChunkJob  # noqa: E402
from sampling.hf import HFSampler  # noqa: E402
from stages.rejection import chunk_params, rollout_rows  # noqa: E402
from storage.rollout_store import insert_rollouts  # noqa: E402


@dataclass
class Run:
    """One way of sampling every chunk, and where its time went."""

    name: str
    wall: float = 0.0  # first chunk sent to last chunk stored
    start: float = 0.0  # actors started and models loaded
    load: float = 0.0  # mean model load inside an actor
    tokens: int = 0
    compute: list[float] = field(default_factory=list)  # per chunk, in the sampler
    scoring: list[float] = field(default_factory=list)  # per chunk, in this process
    insert: list[float] = field(default_factory=list)
    result_bytes: list[int] = field(default_factory=list)
    workers: int = 1

    @property
    def throughput(self) -> float:
        return self.tokens / self.wall

    def idle_per_chunk(self) -> float:
        """Time an actor was not sampling, per chunk: transfer, queueing, waiting on us."""
        return max(0.0, self.workers * self.wall - sum(self.compute)) / len(self.compute)


def prepare(args: argparse.Namespace, folder: Path):
    """The model folder, the chunks of rendered prompts and the tiny profile's rejection config."""
    profile = load_profile("tiny", [])
    train, _ = split_world(profile.data.world)
    problems = train[: args.prompts]
    if args.model:
        model_path = Path(args.model)
    else:
        tokenizer = train_tokenizer([p.question for p in train], profile.bootstrap.vocab_size)
        model = build_model(
            profile.bootstrap.model,
            len(tokenizer),
            tokenizer.pad_token_id,
            tokenizer.eos_token_id,
        )
        model_path = save_model(model, tokenizer, folder).path
    tokenizer = load_tokenizer(model_path)
    rule_rewards = [t for t in profile.rejection.rewards if t.name != PREFERENCE]  # no RM here
    config = profile.rejection.model_copy(
        update={
            "max_new_tokens": args.max_new_tokens,
            "batch_size": args.batch,
            "rewards": rule_rewards,
        }
    )
    size, g = args.chunk, args.n
    chunks = [problems[i : i + size] for i in range(0, len(problems), size)]
    jobs = [
        ChunkJob([render_prompt(tokenizer, p.question) for p in chunk], g, chunk_params(config, i))
        for i, chunk in enumerate(chunks)
    ]
    return model_path, tokenizer, config, chunks, jobs


def store(run: Run, index: int, groups, chunks, jobs, tokenizer, rewards, db: Path) -> None:
    """What the stage does with a chunk that came back: score it, insert it."""
    began = time.perf_counter()
    lengths = [len(ids) for ids in tokenizer(jobs[index].prompts)["input_ids"]]
    rows = rollout_rows("bench", chunks[index], jobs[index].prompts, groups, lengths, rewards)
    run.scoring.append(time.perf_counter() - began)
    began = time.perf_counter()
    insert_rollouts(db, rows)
    run.insert.append(time.perf_counter() - began)
    run.tokens += sum(len(c.token_ids) for group in groups for c in group)
    run.result_bytes.append(len(pickle.dumps(groups)))


def in_process(model_path, tokenizer, config, chunks, jobs, rewards, db) -> Run:
    """The peer: one sampler in this process, one thread, chunk after chunk."""
    torch.set_num_threads(1)
    sampler = HFSampler(load_model(model_path), tokenizer, config.batch_size, show_progress=False)
    run = Run("one process")
    began = time.perf_counter()
    for index, job in enumerate(jobs):
        compute = time.perf_counter()
        groups = sampler.generate(job.prompts, job.n, job.params)
        run.compute.append(time.perf_counter() - compute)
        store(run, index, groups, chunks, jobs, tokenizer, rewards, db)
    run.wall = time.perf_counter() - began
    return run


def on_actors(
    cluster, model_path, tokenizer, config, chunks, jobs, rewards, db, name: str = ""
) -> Run:
    from cluster.actors import ActorSampler

    run = Run(name or f"{cluster.workers} actor{'s' if cluster.workers > 1 else ''}")
    run.workers = cluster.workers
    began = time.perf_counter()
    sampler = ActorSampler.start(cluster, config.sampler, model_path, config.batch_size)
    run.start = time.perf_counter() - began
    run.load = statistics.fmean(s["load_seconds"] for s in sampler.startup)
    try:
        began = time.perf_counter()
        for index, result in sampler.run_chunk_results(jobs):
            run.compute.append(result.seconds)
            store(run, index, result.groups, chunks, jobs, tokenizer, rewards, db)
        run.wall = time.perf_counter() - began
    finally:
        sampler.close()
    return run


def report(runs: list[Run], args: argparse.Namespace) -> None:
    print(
        f"\n{args.prompts} prompts x {args.n} samples in chunks of {args.chunk} prompts, "
        f"{args.max_new_tokens} new tokens at most, one torch thread per sampler; load "
        f"{os.getloadavg()[0]:.2f} (1-min average) at the end"
    )
    head = f"{'':<12}{'tok/s':>8}{'wall s':>8}{'start s':>8}{'load s':>8}"
    head += f"{'sample/chunk':>13}{'idle/chunk':>11}{'score/chunk':>12}{'insert/chunk':>13}"
    print(head + f"{'KiB/chunk':>10}")
    for run in runs:
        line = f"{run.name:<12}{run.throughput:>8.0f}{run.wall:>8.1f}{run.start:>8.1f}"
        line += f"{run.load:>8.1f}{statistics.fmean(run.compute):>13.3f}"
        line += f"{run.idle_per_chunk():>11.3f}{statistics.fmean(run.scoring):>12.3f}"
        line += f"{statistics.fmean(run.insert):>13.3f}"
        print(line + f"{statistics.fmean(run.result_bytes) / 1024:>10.1f}")
    by_name = {run.name: run for run in runs}
    one, two, peer = by_name["1 actor"], by_name["2 actors"], by_name["one process"]
    print(f"\n1 actor / one process:   {one.throughput / peer.throughput:.3f}")
    print(f"scaling efficiency at 2: {two.throughput / (2 * one.throughput):.3f}")
    with_start = [r.tokens / (r.wall + r.start) for r in (one, two)]
    print(f"  counting actor start:  {with_start[1] / (2 * with_start[0]):.3f}")
    kept = by_name["2 kept"]
    print(
        f"a stage's start on 2 actors kept from the stage before: {kept.start:.2f} s, on 2 new "
        f"actors {two.start:.2f} s ({kept.start / two.start:.3f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a saved model folder (default: untrained, tiny shape)")
    parser.add_argument("--prompts", type=int, default=192)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--chunk", type=int, default=16, help="prompts per chunk")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64, help="rows decoded together")
    args = parser.parse_args()
    with loopback_cluster() as (address, folder):
        model_path, tokenizer, config, chunks, jobs = prepare(args, folder / "model")
        rewards = RewardSet.from_terms(config.rewards)
        runs = [in_process(model_path, tokenizer, config, chunks, jobs, rewards, folder / "a.db")]
        for workers in (1, 2):
            placed = ClusterConfig(address=address, workers=workers)
            db = folder / f"actors{workers}.db"
            runs.append(on_actors(placed, model_path, tokenizer, config, chunks, jobs, rewards, db))
        runs.append(kept_run(placed, model_path, tokenizer, config, chunks, jobs, rewards, folder))
        report(runs, args)


def kept_run(cluster, model_path, tokenizer, config, chunks, jobs, rewards, folder) -> Run:
    """Two stages in a row within a flow's block that keeps sampling actors (cluster.kept):
    the first starts them, the second, measured, takes them and loads its model."""
    from cluster.kept import kept_actors

    with kept_actors(cluster):
        db = folder / "before-kept.db"
        on_actors(cluster, model_path, tokenizer, config, chunks[:1], jobs[:1], rewards, db)
        db = folder / "kept.db"
        return on_actors(
            cluster, model_path, tokenizer, config, chunks, jobs, rewards, db, name="2 kept"
        )


@contextmanager
def loopback_cluster() -> Iterator[tuple[str, Path]]:
    """A two-node Ray cluster on loopback (one CPU and a 100 MiB object store each) and a
    scratch folder; both gone after the block."""
    from ray.cluster_utils import Cluster

    folder = Path(tempfile.mkdtemp(prefix="r1bench-", dir="/tmp"))
    # Ray writes the cluster's address into its default temp folder whatever temp_dir says: ours
    os.environ["RAY_TMPDIR"] = str(folder)
    (folder / "ray").mkdir()
    node = {"num_cpus": 1, "object_store_memory": 100 * 2**20}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node, "include_dashboard": False, "temp_dir": str(folder / "ray")},
    )
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        yield cluster.address, folder
    finally:
        from cluster.connect import disconnect

        disconnect()
        cluster.shutdown()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
