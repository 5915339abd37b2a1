"""The sampler comparison runs here on CPU (the GPU run takes the figures): every way samples,
and the timed call counts each generated token up to its stop token."""

import json

import torch

from benchmarks import gpu_sampler


def test_every_way_samples_on_cpu(tmp_path, capsys):
    out = tmp_path / "sampler.json"
    argv = ["--device", "cpu", "--shape", "tiny", "--prompts", "4", "--n", "2",
            "--max-new-tokens", "12", "--profile", "--out", str(out)]  # fmt: skip
    assert gpu_sampler.main(argv) == 0
    runs = {r["way"]: r for r in json.loads(out.read_text())}
    assert set(runs) == set(gpu_sampler.WAYS)
    for run in runs.values():
        assert run["ok"] and 0 < run["tokens"] <= 4 * 2 * 12, run
        assert run["profile"]["events"] > 0 and not run["profile"]["error"], run
    assert "x peer" in capsys.readouterr().out


def test_generated_lengths_end_at_the_first_stop_token():
    new = torch.tensor([[5, 7, 2, 9], [5, 5, 5, 5], [2, 2, 0, 0]])
    assert gpu_sampler.generated_lengths(new, [2]).tolist() == [3, 4, 1]
