"""What a scheduled evaluation keeps of its regenerated suites, night after night: the held-out
problems and general prompts it evaluates on and records as its inputs, not the training sets
that regenerating them writes beside them (a real-data profile's whole training file, written
again each night). Before, each evaluation's folder kept them all for good: 2.5 MB a night for
tiny, 2.1 MB of it never read."""

from __future__ import annotations

from configs.profiles import load_profile
from storage.digests import file_digest
from storage.paths import StatePaths
from storage.tracking import experiment_id, tracking_client
from tasks.scheduled_eval import evaluation_dir, prepare_data


def test_an_evaluation_keeps_only_the_suites_it_evaluates_on(tmp_path):
    config = load_profile("micro")
    paths = StatePaths(tmp_path / "state").ensure()
    client = tracking_client(paths)
    run_id = client.create_run(experiment_id(client, "r1-micro-evaluation", paths)).info.run_id

    data = prepare_data.fn(config.data, paths, run_id)

    kept = sorted(
        str(path.relative_to(evaluation_dir(paths, run_id)))
        for path in evaluation_dir(paths, run_id).rglob("*")
        if path.is_file()
    )
    assert kept == ["general/general_eval.jsonl", "problems/heldout.jsonl"]
    assert data.problems.n_heldout > 0 and data.general_prompts_path is not None
    assert data.digests == {
        "problems-heldout": file_digest(data.problems.heldout_path),
        "general-eval_prompts": file_digest(data.general_prompts_path),
    }
