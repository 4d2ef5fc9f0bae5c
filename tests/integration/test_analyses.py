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


NAMES = sorted(p.stem for p in ANALYSES.glob("*.py") if not p.stem.startswith("_"))
OWN_TESTS = ("bench_capture", "bench_census", "head_census")  # smoke-run by the tests above


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
