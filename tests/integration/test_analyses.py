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
OWN_TESTS = ("bench_attribution", "bench_capture", "bench_census", "bench_flow", "bench_perturb",
             "head_census", "perturbation_studies", "rollout_trend")  # their own tests below


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
