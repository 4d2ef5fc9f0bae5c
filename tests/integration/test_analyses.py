"""Every analysis script runs end to end at smoke size and writes its run folder."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ANALYSES = Path(__file__).resolve().parents[2] / "analyses"


def load(name):
    spec = importlib.util.spec_from_file_location(name, ANALYSES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_capture_smoke(tmp_path, monkeypatch):
    bench = load("bench_capture")
    monkeypatch.setattr(sys, "argv", ["bench_capture.py"])
    bench.main(["--smoke", "--repeats", "1", "--out", str(tmp_path)])
    summary = (tmp_path / "summary.csv").read_text()
    assert "streaming entropy" in summary
    checks = {line.split(",")[0]: float(line.rsplit(",", 1)[1])
              for line in (tmp_path / "checks.csv").read_text().splitlines()[1:]}
    assert checks["1: max |capture maps - eager attentions|"] <= 1e-5
    assert checks["3: max |streaming entropy - full entropy| (nats)"] <= 1e-5
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/bench_capture.py" and record["config"]


def test_bench_census_smoke(tmp_path, monkeypatch):
    bench = load("bench_census")
    monkeypatch.setattr(sys, "argv", ["bench_census.py"])
    bench.main(["--smoke", "--out", str(tmp_path)])
    summary = (tmp_path / "summary.csv").read_text()
    assert "census / bare forward" in summary and "streaming census reducers" in summary
    checks = {line.rsplit(",", 1)[0]: float(line.rsplit(",", 1)[1])
              for line in (tmp_path / "checks.csv").read_text().splitlines()[1:]}
    assert checks["1: sentences in the census"] == 40
    assert checks["1: max |entropy full census - census without distances|"] <= 1e-9
    assert checks["2: max |streaming - full-map entropy| at 256 tokens (nats)"] <= 1e-6
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/bench_census.py" and record["config"]


def test_head_census_smoke(tmp_path, monkeypatch):
    census = load("head_census")
    monkeypatch.setattr(sys, "argv", ["head_census.py"])
    census.main(["--smoke", "--out", str(tmp_path)])
    counts = (tmp_path / "label_counts.csv").read_text().splitlines()[1:]
    assert sum(int(line.split(",")[1]) for line in counts) == 72  # MiniLM: 6 x 12 heads
    assert any(line.startswith("det,") for line in
               (tmp_path / "syntax_key.csv").read_text().splitlines())
    for name in ("labels", "scores", "layer_profile", "syntax", "mds"):
        assert (tmp_path / f"{name}.png").stat().st_size > 0
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/head_census.py" and record["config"]


def test_bench_attribution_smoke(tmp_path, monkeypatch):
    import pandas as pd

    bench = load("bench_attribution")
    monkeypatch.setattr(sys, "argv", ["bench_attribution.py"])
    bench.main(["--smoke", "--out", str(tmp_path)])
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary["comparison"].str.contains("captum_one_step").any()
    assert (summary["attnprobe_s_per_example"] > 0).all() and (summary["speedup"] > 0).all()
    assert (summary["max_abs_diff"] <= 1e-5).all()  # the same integral, batched or not
    timing = pd.read_csv(tmp_path / "timing.csv")
    assert set(timing["contender"]) == {"attnprobe", "captum_one_step", "captum_default"}
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/bench_attribution.py" and record["config"]


NAMES = sorted(p.stem for p in ANALYSES.glob("*.py") if not p.stem.startswith("_"))
OWN_TESTS = ("bench_attribution", "bench_capture", "bench_causal", "bench_census", "bench_flow",
             "bench_perturb", "finetune_diff", "head_census", "induction_circuit", "long_context",
             "perturbation_studies", "rollout_trend",  # their own tests below
             "bench_patch",  # tests/analyses/test_bench_patch.py
             "bench_value_zeroing",  # tests/analyses/test_bench_value_zeroing.py
             # tests/analyses/test_faithfulness_study.py
             "faithfulness_study", "bench_faithfulness",
             # tests/integration/test_bench_big.py, test_gpu_check.py (gpu_check needs --device)
             "bench_big", "gpu_check")


@pytest.mark.parametrize("name", NAMES)
def test_every_analysis_has_the_convention(name):
    module = load(name)
    assert callable(module.run) and callable(module.main)
    assert hasattr(module.Config, "smoke")


@pytest.mark.parametrize("name", [n for n in NAMES if n not in OWN_TESTS])
def test_every_analysis_runs_at_smoke_size(name, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [f"{name}.py"])
    load(name).main(["--smoke", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == f"analyses/{name}.py"
    assert any(tmp_path.glob("*.csv"))


def test_bench_perturb_smoke(tmp_path, monkeypatch):
    bench = load("bench_perturb")
    monkeypatch.setattr(sys, "argv", ["bench_perturb.py"])
    bench.main(["--smoke", "--out", str(tmp_path)])
    summary = (tmp_path / "summary.csv").read_text()
    assert "8 permutations of layer 3" in summary
    checks = {line.rsplit(",", 1)[0]: float(line.rsplit(",", 1)[1])
              for line in (tmp_path / "checks.csv").read_text().splitlines()[1:]}
    assert checks["tokens in the sentence"] == 30
    assert checks["same argmax key in every permuted row (1 = yes)"] == 1
    assert checks["max |batched - sequential| permuted weights"] <= 1e-6
    assert checks["max |batched - sequential| last hidden state"] <= 1e-4
    assert checks["distinct embeddings among the batched permutations"] == 8
    # the sweep part: 3 heads of layers 4 and 5, the sweep's table equal to 3 single-head runs
    sweep = (tmp_path / "sweep_summary.csv").read_text()
    assert "3 single-head ablations (minilm, 1 text(s)" in sweep
    checks = {line.rsplit(",", 1)[0]: float(line.rsplit(",", 1)[1])
              for line in (tmp_path / "sweep_checks.csv").read_text().splitlines()[1:]}
    assert checks["heads swept"] == 3
    assert checks["rows: sweep table"] == checks["rows: sequential tables"] == 3 * 2
    assert checks["same columns and rows in the same order (1 = yes)"] == 1
    assert checks["max |sweep - sequential| baseline / perturbed / change"] <= 1e-5
    assert checks["heads in the sweep's layer x head grid of cosine distances"] == 3
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/bench_perturb.py" and record["config"]


def test_bench_flow_smoke(tmp_path, monkeypatch):
    bench = load("bench_flow")
    monkeypatch.setattr(sys, "argv", ["bench_flow.py"])
    bench.main(["--smoke", "--out", str(tmp_path)])
    summary = (tmp_path / "summary.csv").read_text()
    assert "per pair, 4 inputs" in summary and "networkx extrapolated" in summary
    checks = {line.rsplit(",", 1)[0]: float(line.rsplit(",", 1)[1])
              for line in (tmp_path / "checks.csv").read_text().splitlines()[1:]}
    assert checks["tokens in the map"] == 16
    assert checks["max relative difference ours vs networkx (subset)"] <= 1e-6
    assert abs(checks["ours normalised flow sums to 1 (all inputs)"] - 1) <= 1e-9
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/bench_flow.py" and record["config"]


def test_perturbation_studies_smoke_is_reproducible(tmp_path, monkeypatch):
    import pandas as pd

    studies = load("perturbation_studies")
    monkeypatch.setattr(sys, "argv", ["perturbation_studies.py"])
    first, second = tmp_path / "first", tmp_path / "second"
    studies.main(["--smoke", "--out", str(first)])
    studies.main(["--smoke", "--out", str(second)])
    csvs = sorted(p.name for p in first.glob("*.csv"))
    assert csvs == sorted(p.name for p in second.glob("*.csv"))
    for name in csvs:  # the same seed gives the same tables, byte for byte
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    for name in ("permutation", "uniform", "erasure", "adversarial", "importance", "pruning"):
        assert len(pd.read_csv(first / f"{name}.csv")) > 0, name
    uniform = pd.read_csv(first / "uniform.csv")
    minilm = uniform[uniform["model"] == "minilm"]
    assert (minilm["unit"] == "head").sum() == 72 and (minilm["unit"] == "layer").sum() == 6
    erasure = pd.read_csv(first / "erasure_summary.csv")
    assert set(erasure["order"]) == {"attention", "integrated_gradients", "random"}
    pruning = pd.read_csv(first / "pruning.csv")
    assert (pruning.loc[pruning["n_pruned"] == 0, "metric_relative"] == 1).all()
    for name in ("permutation", "uniform", "erasure", "pruning"):
        assert (first / f"{name}.png").stat().st_size > 0
    record = json.loads((first / "provenance.json").read_text())
    assert record["script"] == "analyses/perturbation_studies.py" and record["config"]


def test_rollout_trend_smoke(tmp_path, monkeypatch):
    import pandas as pd

    trend_script = load("rollout_trend")
    monkeypatch.setattr(sys, "argv", ["rollout_trend.py"])
    trend_script.main(["--smoke", "--out", str(tmp_path)])
    trend = pd.read_csv(tmp_path / "trend.csv")
    assert list(trend.columns) == ["view", "layer", "reference", "family", "mean_rho", "std",
                                   "frac_significant", "n"]
    views = ("raw", "raw_max", "rollout", "rollout_max", "flow", "flow_max")
    references = ("saliency", "input_x_gradient", "occlusion", "leave_one_out")
    assert len(trend) == len(views) * 6 * len(references)  # MiniLM: 6 layers
    assert set(trend.view) == set(views) and set(trend.reference) == set(references)
    assert (trend.n == 3).all() and trend.mean_rho.between(-1, 1).all()
    assert trend.frac_significant.between(0, 1).all()
    checks = pd.read_csv(tmp_path / "checks.csv").set_index("check").value
    assert checks["sentences explained"] == 3
    assert checks["max |rho(flow) - rho(rollout)| at layer 0 (identical)"] <= 1e-9
    verdict = pd.read_csv(tmp_path / "verdict.csv")
    assert len(verdict) == len(views) * len(references) and verdict.shown.dtype == bool
    assert (tmp_path / "rollout_trend.png").stat().st_size > 0
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/rollout_trend.py" and record["config"]


def test_induction_circuit_smoke(tmp_path, monkeypatch):
    import pandas as pd

    script = load("induction_circuit")
    monkeypatch.setattr(sys, "argv", ["induction_circuit.py"])
    script.main(["--smoke", "--out", str(tmp_path)])
    model = pd.read_csv(tmp_path / "model.csv").set_index("half")
    assert model.at["second", "accuracy"] > 0.8 and model.at["first", "accuracy"] < 0.2
    ablation = pd.read_csv(tmp_path / "ablation.csv")
    assert (ablation["kind"] == "head").sum() == 8  # ref:induction: 2 layers x 4 heads
    assert ablation.loc[ablation["kind"] == "none", "accuracy_drop"].tolist() == [0]
    assert "induction heads (census)" in set(ablation["ablated"])
    steps = pd.read_csv(tmp_path / "attribution_steps.csv")
    assert set(steps["method"]) >= {"integrated_gradients", "attn_x_grad", "random"}
    assert (steps["top1"] >= 1).all() and (steps["top1"] <= steps["position"]).all()
    shares = pd.read_csv(tmp_path / "attribution.csv")
    parts = shares[[f"share_{r}" for r in ("source+1", "source", "query", "other")]]
    assert (parts.sum(axis=1) - 1).abs().max() < 1e-9  # every step lands in one relation
    checks = pd.read_csv(tmp_path / "checks.csv").set_index("check")["value"]
    assert checks["explained token != the model's own prediction (rows)"] == 0
    for name in ("ablation", "census", "attribution", "pattern", "causal"):
        assert (tmp_path / f"{name}.png").stat().st_size > 0
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/induction_circuit.py" and record["config"]
    # the causal section: every prediction of the circuit holds on the smoke sequences
    causal = pd.read_csv(tmp_path / "causal.csv")
    assert len(causal) == 8 and causal["holds"].all(), causal.to_string()
    knocked = pd.read_csv(tmp_path / "knockout.csv").set_index("blocked")
    assert knocked.at["copy edges", "edges"] == knocked.at["random edges", "edges"] > 0
    patching = pd.read_csv(tmp_path / "patching.csv")
    assert len(patching) == 8 and patching["effect"].notna().all()


def test_finetune_diff_smoke_is_reproducible(tmp_path, monkeypatch):
    import math

    import pandas as pd

    script = load("finetune_diff")
    monkeypatch.setattr(sys, "argv", ["finetune_diff.py"])
    first, second = tmp_path / "first", tmp_path / "second"
    script.main(["--smoke", "--out", str(first)])
    script.main(["--smoke", "--out", str(second)])
    for name in ("training", "heads", "layers", "scores", "verdict"):  # seeded: same bytes
        if name == "training":  # its seconds differ
            a, b = (pd.read_csv(d / "training.csv").drop(columns="seconds")
                    for d in (first, second))
            pd.testing.assert_frame_equal(a, b)
        else:
            assert (first / f"{name}.csv").read_bytes() == (second / f"{name}.csv").read_bytes()
    heads = pd.read_csv(first / "heads.csv")
    layers = pd.read_csv(first / "layers.csv")
    assert len(heads) == 4 and list(layers["layer"]) == [0, 1]  # the smoke BERT: 2 x 2
    assert heads["js"].between(0, math.log(2)).all() and (heads["js"] > 0).all()
    assert layers["js"].tolist() == pytest.approx(heads.groupby("layer")["js"].mean().tolist())
    training = pd.read_csv(first / "training.csv").iloc[0]
    assert training["train_examples"] == 32 and training["held_out_examples"] == 16
    verdict = pd.read_csv(first / "verdict.csv")
    assert list(verdict["measure"]) == ["js", "one_minus_cosine"]
    for name in ("layer_js", "head_js"):
        assert (first / f"{name}.png").stat().st_size > 0
    record = json.loads((first / "provenance.json").read_text())
    assert record["script"] == "analyses/finetune_diff.py" and record["config"]["steps"] == 3


def test_long_context_smoke(tmp_path, monkeypatch):
    import pandas as pd

    script = load("long_context")
    monkeypatch.setattr(sys, "argv", ["long_context.py"])
    script.main(["--smoke", "--out", str(tmp_path)])
    heads = pd.read_csv(tmp_path / "heads.csv")
    found = set(heads.loc[heads["retrieval_head"], "head_id"])
    assert found == set(heads.loc[heads["label"] == "induction", "head_id"]) == \
        {"L1H0", "L1H1", "L1H2", "L1H3"}  # ref:induction's circuit (issue 12 §6)
    grid = pd.read_csv(tmp_path / "grid.csv")
    assert len(grid) == 2 * 2 and grid["accuracy"].between(0, 1).all()
    assert (grid["copy_steps"] == grid["examples"] * 10).all()  # needle 12, prefix 2
    retrieval = pd.read_csv(tmp_path / "retrieval.csv")
    assert len(retrieval) == 4 * 8 and retrieval["retrieval"].between(0, 1).all()
    ablation = pd.read_csv(tmp_path / "ablation.csv").set_index("ablated")
    assert ablation.at["none", "drop"] == 0
    assert ablation.at["retrieval heads", "accuracy"] <= 0.1  # the copy breaks
    positions = pd.read_csv(tmp_path / "positions.csv")
    assert set(positions["head_id"]) == {"L0H0", "L0H1", "L0H2", "L0H3"}
    assert (tmp_path / "long_context.png").stat().st_size > 0
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/long_context.py" and record["config"]


def test_bench_causal_smoke(tmp_path, monkeypatch):
    import pandas as pd

    bench = load("bench_causal")
    monkeypatch.setattr(sys, "argv", ["bench_causal.py"])
    bench.main(["--smoke", "--out", str(tmp_path)])
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary["benchmark"].str.contains("capture during generate").sum() == 2
    assert summary["benchmark"].str.contains("peak memory / full maps").any()
    checks = pd.read_csv(tmp_path / "checks.csv").set_index("check")["value"]
    for model in ("llama", "gpt2"):
        assert float(checks[f"1: {model}: captured generation == plain generation"]) == 1
    long = pd.read_csv(tmp_path / "long_context.csv")
    assert long["length"].tolist() == [64, 128] and (long["heads_scored"] == 8).all()
    # full maps by arithmetic: 2 layers x 4 heads x L^2 x 4 bytes
    assert long["full_maps_mib"].tolist() == [2 * 4 * n * n * 4 / 2**20 for n in (64, 128)]
    assert (long["largest_block_mib"] <= 16).all()  # the seam's block budget
    generation = pd.read_csv(tmp_path / "generation.csv")
    assert set(generation["contender"]) == {"generate", "capture(model) around generate"}
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/bench_causal.py" and record["config"]
