"""analyses/bench_value_zeroing.py at smoke size: both contenders ran, the batched scores equal
the paper's one-forward-per-token loop, and the run folder is written (no timing is asserted).

Smoke size runs in float64, where the batched recompute and the loop differ by rounding only:
a cosine distance ``d`` off by a relative ``ε ≈ 1e-15`` in the outputs moves by about
``ε·sqrt(2d)``, so with every distance ≥ 1e-8 (checked) a normalised score moves by < 1e-10.
"""

import importlib
import json
import sys

import pandas as pd
import torch


def test_bench_value_zeroing_smoke(tmp_path, monkeypatch):
    bench = importlib.import_module("bench_value_zeroing")
    monkeypatch.setattr(sys, "argv", ["bench_value_zeroing.py"])
    threads = torch.get_num_threads()
    bench.main(["--smoke", "--out", str(tmp_path)])
    assert torch.get_num_threads() == threads  # the benchmark's one thread is not left behind
    cfg = bench.Config.smoke()
    timing = pd.read_csv(tmp_path / "timing.csv")
    assert set(timing["contender"]) == {"batched", "one_forward_per_token"}
    assert (timing["repeats"] == cfg.repeats).all() and (timing["median_s"] > 0).all()
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert len(summary) == 1 and summary["ratio_of_medians"].iloc[0] > 0
    assert summary["target_ratio"].iloc[0] == 0.3  # the figure

    value = dict(zip(pd.read_csv(tmp_path / "checks.csv")["check"],
                     pd.read_csv(tmp_path / "checks.csv")["value"], strict=True))
    assert value["tokens"] == cfg.n_tokens
    assert value["min cosine distance (one forward per token)"] >= 1e-8
    assert value["max |batched - one forward per token| (normalised scores)"] <= 1e-10
    assert value["batched rows sum to 1 (max |sum - 1|)"] <= 1e-12
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/bench_value_zeroing.py" and record["config"]


def test_the_loop_reference_zeroes_the_layer_it_is_given():
    """The baseline is the paper's procedure, not a copy of the batched code: zeroing another
    layer's values gives another matrix, and the same layer gives the batched one."""
    bench = importlib.import_module("bench_value_zeroing")
    cfg = bench.Config.smoke()
    model, inputs = bench.bert_model(cfg), bench.random_inputs(cfg)
    batched = bench.value_zeroing(model, None, "", layers=[1], inputs=inputs).scores[0]
    same, _ = bench.one_forward_per_token(model, inputs, 1)
    other, _ = bench.one_forward_per_token(model, inputs, 0)
    torch.testing.assert_close(batched, same, rtol=0, atol=1e-10)
    assert float((batched - other).abs().max()) > 1e-3
