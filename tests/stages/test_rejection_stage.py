"""Stage 4 against a real DuckDB file: a run that dies half-way and is started again stores every
rollout exactly once, the same rollouts an uninterrupted run stores."""

import duckdb
import pyarrow as pa
import pytest

from configs.reinforcement import RewardTerm
from configs.schema import FunnelConfig, RejectionConfig
from models.saved import ModelRef, save_model
from problems.loader import write_problems
from problems.types import Problem
from stages import rejection
from stages.tracker import NullTracker
from storage import rollout_store
from tasks.progress import step_text
from tests.tiny_models import make_tokenizer, tiny_model
from training import PROGRESS

G = 3
CONFIG = RejectionConfig(
    samples_per_prompt=G,
    max_new_tokens=12,
    chunk_prompts=4,
    general_prompts=2,
    rewards=[
        RewardTerm(name="accuracy", kinds=["reasoning"]),
        RewardTerm(name="format"),
        RewardTerm(name="tag_count"),
    ],
    funnel=FunnelConfig(require_correct=False, require_well_formed=False, min_language_share=None),
)
REASONING = [Problem(f"r{i}", f"What is {i} + {i}?", str(2 * i)) for i in range(10)]
GENERAL = [Problem(f"g{i}", f"Say hello {i} times.", "", kind="general") for i in range(3)]


class Crash(RuntimeError):
    """The process dying right after a chunk was committed."""


class DuckDBSink:
    def __init__(self, db, model_id, crash_after=None):
        self.db, self.model_id, self.crash_after, self.inserts = db, model_id, crash_after, 0

    def stored(self):
        return rollout_store.existing_samples(self.db, self.model_id)

    def insert(self, rows: pa.Table) -> int:
        new = rollout_store.insert_rollouts(self.db, rows)
        self.inserts += 1
        if self.crash_after is not None and self.inserts >= self.crash_after:
            raise Crash(f"killed after chunk {self.inserts}")
        return new


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> ModelRef:
    tokenizer = make_tokenizer()
    return save_model(tiny_model(tokenizer), tokenizer, tmp_path_factory.mktemp("policy"))


def stored_rows(db):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(
            "SELECT prompt_id, sample_index, kind, completion, reward_tag_count FROM rollouts "
            "ORDER BY prompt_id, sample_index"
        ).fetchall()


def test_select_prompts_caps_each_kind():
    picked = rejection.select_prompts(
        CONFIG.model_copy(update={"reasoning_prompts": 3}), REASONING, GENERAL
    )
    assert [p.id for p in picked] == ["r0", "r1", "r2", "g0", "g1"]


def test_the_training_file_is_read_no_further_than_the_prompts_it_gives(tmp_path):
    """A large data set's prepared file is read up to `reasoning_prompts`, not whole and then
    cut: the row after them, unreadable, is never reached."""
    train = write_problems(tmp_path / "train.jsonl", REASONING[:3])
    with train.open("a") as f:
        f.write("not a row of the prepared file\n")
    config = CONFIG.model_copy(update={"reasoning_prompts": 3})

    picked = rejection.select_prompts(config, rejection.reasoning_problems(config, train), GENERAL)

    assert [p.id for p in picked] == ["r0", "r1", "r2", "g0", "g1"]


def test_a_killed_run_resumes_without_duplicates_or_gaps(model, tmp_path):
    prompts = rejection.select_prompts(CONFIG, REASONING, GENERAL)  # 12 prompts: 3 chunks
    whole_db, killed_db = tmp_path / "whole.duckdb", tmp_path / "killed.duckdb"
    report = rejection.run(CONFIG, model, "m", prompts, DuckDBSink(whole_db, "m"), NullTracker())
    assert (report.chunks, report.chunks_skipped, report.inserted) == (3, 0, 12 * G)

    with pytest.raises(Crash):
        rejection.run(
            CONFIG, model, "m", prompts, DuckDBSink(killed_db, "m", crash_after=2), NullTracker()
        )
    assert rollout_store.count_rollouts(killed_db, "m") == 8 * G  # two chunks survived the kill
    resumed = rejection.run(CONFIG, model, "m", prompts, DuckDBSink(killed_db, "m"), NullTracker())
    assert (resumed.chunks_skipped, resumed.sampled, resumed.inserted) == (2, 4 * G, 4 * G)
    assert stored_rows(killed_db) == stored_rows(whole_db)  # the same rollouts, each once

    again = rejection.run(CONFIG, model, "m", prompts, DuckDBSink(killed_db, "m"), NullTracker())
    assert (again.chunks_skipped, again.sampled) == (3, 0)
    assert rollout_store.count_rollouts(killed_db, "m") == 12 * G


def test_rewards_are_routed_by_prompt_kind(model, tmp_path):
    db = tmp_path / "r.duckdb"
    prompts = rejection.select_prompts(CONFIG, REASONING[:2], GENERAL[:2])
    rejection.run(CONFIG, model, "m", prompts, DuckDBSink(db, "m"), NullTracker())
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT kind, count(*), count(reward_format), count(reward_tag_count) "
            "FROM rollouts GROUP BY kind ORDER BY kind"
        ).fetchall()
        general_accuracy = con.execute(
            "SELECT count(reward_accuracy) FROM rollouts WHERE kind = 'general'"
        ).fetchone()[0]
    assert rows == [("general", 2 * G, 2 * G, 2 * G), ("reasoning", 2 * G, 2 * G, 2 * G)]
    assert general_accuracy == 0  # accuracy is limited to reasoning prompts: NULL, not 0


def test_rows_are_reused_only_under_the_same_sampling_settings(model, tmp_path):
    """A rerun with more tokens or more samples per prompt samples its own rows; one that only
    changes the funnel, the batch size or the sampler's time limits takes the stored rows."""
    db = tmp_path / "r.duckdb"
    prompts = rejection.select_prompts(CONFIG, REASONING[:4], [])

    def sample(config: RejectionConfig) -> rejection.SamplingReport:
        key = rejection.rollouts_key("digest", config)
        return rejection.run(config, model, key, prompts, DuckDBSink(db, key), NullTracker())

    first = sample(CONFIG)
    longer = CONFIG.model_copy(update={"max_new_tokens": 24, "samples_per_prompt": 5})
    second = sample(longer)
    assert (first.inserted, second.sampled, second.inserted) == (4 * G, 4 * 5, 4 * 5)
    stricter = CONFIG.model_copy(update={"funnel": FunnelConfig(require_correct=True)})
    assert rejection.rollouts_key("digest", stricter) == rejection.rollouts_key("digest", CONFIG)
    assert sample(stricter).sampled == 0
    limits = CONFIG.sampler.model_copy(update={"generate_timeout_s": 60.0})
    assert sample(CONFIG.model_copy(update={"batch_size": 1, "sampler": limits})).sampled == 0
    with duckdb.connect(str(db), read_only=True) as con:
        by_key = con.execute(
            "SELECT model_id, count(*), max(completion_tokens) FROM rollouts GROUP BY model_id"
        ).fetchall()
    counts = {key: (n, longest) for key, n, longest in by_key}
    assert counts[rejection.rollouts_key("digest", CONFIG)][0] == 4 * G
    assert counts[rejection.rollouts_key("digest", CONFIG)][1] <= CONFIG.max_new_tokens
    assert counts[rejection.rollouts_key("digest", longer)][0] == 4 * 5
    other = {**CONFIG.model_dump(), "temperature": 1.0, "rewards": CONFIG.rewards[:1]}
    keys = {rejection.rollouts_key("digest", CONFIG), rejection.rollouts_key("other", CONFIG)}
    keys.add(rejection.rollouts_key("digest", RejectionConfig(**other)))
    assert len(keys) == 3 and all(k.startswith(("digest:", "other:")) for k in keys)


class Recording(NullTracker):
    def __init__(self):
        self.points: list[tuple[int | None, dict]] = []

    def log_metrics(self, metrics, step=None):
        self.points.append((step, metrics))


def test_progress_counts_chunks_done_when_they_come_back_out_of_order(model, tmp_path, monkeypatch):
    """A cluster's actors hand chunks back as they finish: the last chunk first. The progress
    line reads "step 1 of 3 (33%)", not "step 3 of 9 (33%)"."""
    sample_chunks = rejection.sample_chunks

    def last_first(sampler, jobs):
        return reversed(list(sample_chunks(sampler, jobs)))

    monkeypatch.setattr(rejection, "sample_chunks", last_first)
    tracker = Recording()
    prompts = rejection.select_prompts(CONFIG, REASONING, GENERAL)  # 12 prompts: 3 chunks
    rejection.run(CONFIG, model, "m", prompts, DuckDBSink(tmp_path / "r.duckdb", "m"), tracker)
    lines = [step_text(step, m[PROGRESS]) for step, m in tracker.points if PROGRESS in m]
    assert lines == ["step 1 of 3 (33%)", "step 2 of 3 (67%)", "step 3 of 3 (100%)"]
