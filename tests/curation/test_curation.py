import pytest

from configs.data import MathWorld, WorldConfig
from configs.supervised import FilterConfig, TeacherConfig
from contracts.answer_format import is_well_formed
from curation.filters import ExampleBound, apply_filters, distinct_trigram_share, is_readable
from curation.teacher import Trace, write_trace, write_traces
from problems.world import split_world

SPEC = FilterConfig(
    min_tokens=10, max_tokens=120, min_language_share=0.95, min_distinct_trigrams=0.75
)
GOOD = (
    "<think> Let me work through this step by step. First, 7 + 5 = 12. Finally, 12 * 2 = 24. "
    "Let me check the last step: 12 * 2 gives 24, which matches. </think> "
    "<answer> Starting from 7, the steps give 12 then 24. The answer is 24. </answer>"
)


def words(text: str) -> int:
    return len(text.split())


def trace(completion: str, pid: str = "p1", answer: str = "24", language: str = "latin") -> Trace:
    return Trace(pid, "What is (7 + 5) * 2?", answer, language, completion, "none")


def only(completion: str, **kw) -> dict[str, int]:
    return apply_filters([trace(completion, **kw)], SPEC, words).counts


def test_the_length_filter_counts_the_whole_example_sft_sees():
    """A completion within max_tokens whose prompt and completion together exceed the SFT
    stage's max_length is removed by the length filter, before SFT would cut it."""
    n = words(GOOD)
    question = len(trace(GOOD).question.split())
    for limit, kept in ((n + question, True), (n + question - 1, False)):
        bound = ExampleBound(limit, lambda t: words(t.question) + words(t.completion))
        result = apply_filters([trace(GOOD)], SPEC, words, bound)
        assert (len(result.kept) == 1) is kept
        assert result.counts["length"] == (0 if kept else 1)


def test_clean_trace_passes_every_filter():
    result = apply_filters([trace(GOOD)], SPEC, words)
    assert len(result.kept) == 1 and sum(result.counts.values()) == 0


def test_format_filter():
    assert only(GOOD.replace("<think>", ""))["format"] == 1


def test_language_filter():
    mixed = GOOD.replace(
        "Let me work through this step by step.", "Λετ με ωορκ τηροθγη τηισ στεπ βυ στεπ."
    )
    assert only(mixed)["language"] == 1
    greek = (
        "<think> Φιρστ, 7 + 5 = 12. Τηεν 12 * 2 = 24. </think> <answer> Τηε ανσωερ ισ 24. </answer>"
    )
    assert only(greek, language="greek")["language"] == 0


def test_length_filter_both_bounds():
    assert (
        only(GOOD.replace("Let me check", " ".join(["and"] * 100) + " Let me check"))["length"] == 1
    )
    assert only("<think> 24 </think> <answer> The answer is 24. </answer>")["length"] == 1


def test_readability_filter_catches_loops_and_missing_summary():
    loop = GOOD.replace("</think>", "12 * 2 gives 24, which matches. " * 4 + "</think>")
    assert distinct_trigram_share(loop) < 0.75
    assert only(loop)["readability"] == 1
    bare = GOOD.split("<answer>")[0] + "<answer> 24 </answer>"
    assert not is_readable(bare, SPEC)
    assert only(bare)["readability"] == 1


def test_correctness_filter():
    assert only(GOOD, answer="25")["correctness"] == 1


def test_duplicates_filter_is_per_problem_and_whitespace_blind():
    traces = [trace(GOOD), trace(GOOD.replace(" ", "  ")), trace(GOOD, pid="p2")]
    result = apply_filters(traces, SPEC, words)
    assert result.counts["duplicates"] == 1
    assert [t.problem_id for t in result.kept] == ["p1", "p2"]


def test_counts_follow_filter_order_and_each_trace_counts_once():
    both = GOOD.replace("<think>", "")  # fails format; would fail nothing else
    result = apply_filters([trace(both, answer="99")], SPEC, words)
    assert result.counts == {
        "format": 1,
        "language": 0,
        "length": 0,
        "readability": 0,
        "correctness": 0,
        "duplicates": 0,
    }
    assert [name for _, name in result.removed] == ["format"]


def test_teacher_faults_are_each_caught_by_the_filters():
    train, _ = split_world(WorldConfig(seed=0, math=MathWorld(n_train=600, n_heldout=10)))
    traces = write_traces(train, TeacherConfig(seed=1))
    spec = FilterConfig(min_tokens=5, max_tokens=40, min_distinct_trigrams=0.75)
    result = apply_filters(traces, spec, words)
    assert all(count > 0 for count in result.counts.values()), result.counts
    assert all(t.fault == "none" for t in result.kept)


def test_clean_teacher_traces_are_well_formed_and_correct():
    train, _ = split_world(WorldConfig(seed=0, math=MathWorld(n_train=50, n_heldout=5)))
    clean = TeacherConfig.faultless()
    traces = write_traces(train, clean)
    assert all(is_well_formed(t.completion) for t in traces)
    result = apply_filters(traces, SPEC, words)
    assert len(result.kept) == len(traces)


def test_teacher_refuses_problems_without_steps():
    import random

    from problems.types import Problem

    with pytest.raises(ValueError, match="no worked steps"):
        write_trace(Problem("x", "q", "1"), random.Random(0), TeacherConfig())
