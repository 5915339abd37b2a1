"""The block that keeps sampling actors between stages (cluster/kept.py), without a cluster:
what it keeps, for whom, and that it ends everything it kept (ending an actor recorded instead
of Ray's kill)."""

from __future__ import annotations

import pytest

from cluster import kept
from configs.cluster import ClusterConfig
from configs.reinforcement import SamplerConfig

RAY = ClusterConfig(address="127.0.0.1:6379", workers=2)
HF, VLLM = SamplerConfig(), SamplerConfig(backend="vllm")


@pytest.fixture
def ended(monkeypatch) -> list[str]:
    out: list[str] = []
    monkeypatch.setattr(kept, "_end", out.extend)
    return out


def test_a_stage_takes_the_actors_the_stage_before_gave_back(ended):
    with kept.kept_actors(RAY):
        assert kept.take(RAY) == []  # none yet: the stage starts its own
        assert kept.give_back(RAY, HF, ["a", "b"])
        assert kept.take(RAY) == ["a", "b"]
        assert kept.take(RAY) == []  # taken once
        assert kept.give_back(RAY, HF, ["a", "b"])
        assert ended == []
    assert ended == ["a", "b"]  # the block's end ends what it holds


def test_the_block_ends_its_actors_when_the_flow_fails(ended):
    with pytest.raises(RuntimeError, match="stage 3"), kept.kept_actors(RAY):
        kept.give_back(RAY, HF, ["a"])
        raise RuntimeError("stage 3")
    assert ended == ["a"]
    assert not kept.give_back(RAY, HF, ["b"])  # no block open: the caller ends them


def test_other_cluster_settings_start_their_own_and_end_the_kept_ones(ended):
    wider = RAY.model_copy(update={"workers": 3})
    with kept.kept_actors(RAY):
        kept.give_back(RAY, HF, ["a", "b"])
        assert kept.take(wider) == []
        assert ended == ["a", "b"]
        kept.give_back(wider, HF, ["c", "d", "e"])
        kept.give_back(wider, HF, ["f", "g", "h"])  # a second set replaces the first
        assert ended == ["a", "b", "c", "d", "e"]
        kept.release("a training stage places its nodes")
        assert ended[-3:] == ["f", "g", "h"] and kept.take(wider) == []


def test_gpu_and_vllm_actors_are_never_kept(ended):
    on_gpus = RAY.model_copy(update={"gpus_per_worker": 1.0})
    with kept.kept_actors(RAY):
        assert not kept.give_back(RAY, VLLM, ["a"])
        assert not kept.give_back(on_gpus, HF, ["b"])
        assert kept.take(RAY) == [] and kept.take(on_gpus) == []
    assert ended == []  # the stages ended them themselves
    assert kept.keeps(RAY, HF) and not kept.keeps(RAY, VLLM) and not kept.keeps(on_gpus, HF)


def test_an_inner_block_leaves_the_outer_ones_actors(ended):
    with kept.kept_actors(RAY):
        with kept.kept_actors(RAY):  # the distill flow's block inside the pipeline's
            kept.give_back(RAY, HF, ["a"])
        assert ended == [] and kept.take(RAY) == ["a"]


def test_without_a_ray_cluster_or_with_keeping_off_nothing_is_kept(ended):
    off = RAY.model_copy(update={"keep_actors": False})
    for cluster in (None, ClusterConfig(), ClusterConfig(rollouts="process"), off):
        with kept.kept_actors(cluster):
            assert not kept.give_back(RAY, HF, ["a"])
    assert ended == []
