"""The default tiny profile, whole, against the figures it promises (about 12 minutes on 2 cores).

Run with `bash scripts/test.sh -m slow`.
"""

import pytest

# Heavy: the whole tiny pipeline on a Prefect test server (and slow: deselected by default).
pytestmark = pytest.mark.heavy


@pytest.mark.slow
def test_tiny_profile_meets_its_promises(tmp_path, monkeypatch):
    from tests.prefect_harness import prefect_harness

    monkeypatch.setenv("R1_STATE_DIR", str(tmp_path))
    from flows.r1_pipeline import r1_pipeline

    with prefect_harness():
        result = r1_pipeline(profile="tiny")
    rows = {r.stage: r for r in result.rows}
    base, sft = rows["bootstrap"], rows["cold_start_sft"]
    assert 0.05 <= base.metrics["pass_at_1_lenient"] <= 0.60  # it rarely uses the answer block
    assert base.metrics["language_consistency_rate"] < 0.98  # the base mixes scripts
    assert base.metrics["format_rate"] < 0.10  # and rarely uses the format
    assert sft.metrics["format_rate"] >= 0.90
    assert sft.metrics["format_rate"] > base.metrics["format_rate"]
    assert all(n > 0 for n in result.filter_counts.values())
    rl = rows["reasoning_rl"]
    assert rl.metrics["language_consistency_rate"] >= 0.99
    assert rl.metrics["format_rate"] >= 0.99
