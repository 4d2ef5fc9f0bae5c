"""analyses/bench_patch.py at smoke size: every contender ran, the batched tables equal one
patched forward at a time, the patched forward reproduces the batched table's value, and the
run folder is written (no timing is asserted)."""

import importlib
import json
import sys

import pandas as pd


def test_bench_patch_smoke(tmp_path, monkeypatch):
    bench = importlib.import_module("bench_patch")
    monkeypatch.setattr(sys, "argv", ["bench_patch.py"])
    bench.main(["--smoke", "--out", str(tmp_path)])
    cfg = bench.Config.smoke()
    summary = pd.read_csv(tmp_path / "summary.csv")
    names = list(dict.fromkeys(summary["benchmark"]))
    assert len(names) == len(cfg.n_pairs) + 2  # MiniLM per pair count, induction, forward
    assert (summary["contender_s"] > 0).all() and (summary["baseline_s"] > 0).all()
    assert set(summary["contender"]) >= {"batched", "attribution", bench.larger(cfg)}
    timing = pd.read_csv(tmp_path / "timing.csv")
    assert (timing["repeats"] == cfg.repeats).all()

    checks = pd.read_csv(tmp_path / "checks.csv")
    value = dict(zip(checks["benchmark"] + " | " + checks["check"], checks["value"],
                     strict=True))
    for name in names[:-1]:
        for other in ("one at a time", bench.larger(cfg)):
            assert value[f"{name} | same rows in the same order as {other} (1 = yes)"] == 1
            # one table from batches of different shapes: float32 rounding only
            assert value[f"{name} | max |batched - {other}| patched"] <= 1e-5
    rows = [value[f"{name} | patches x pairs (table rows)"] for name in names[:-1]]
    assert rows == [3 * n for n in cfg.n_pairs] + [4 * cfg.induction_len]  # 4 heads of layer 1
    forward = f"patched vs plain forward | max |patched forward - batched table| metric, " \
              f"L{cfg.forward_layer}H{cfg.forward_head}"
    assert value[forward] <= 1e-5
    assert value["patched vs plain forward | max |patched - plain| last hidden state"] > 1e-3

    induction = pd.read_csv(tmp_path / "induction_table.csv")
    assert set(induction["position"]) == set(range(cfg.induction_len))
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/bench_patch.py" and record["config"]
