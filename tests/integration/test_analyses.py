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


NAMES = sorted(p.stem for p in ANALYSES.glob("*.py") if not p.stem.startswith("_"))


@pytest.mark.parametrize("name", NAMES)
def test_every_analysis_has_the_convention(name):
    module = load(name)
    assert callable(module.run) and callable(module.main)
    assert hasattr(module.Config, "smoke")


@pytest.mark.parametrize("name", [n for n in NAMES if n != "bench_capture"])
def test_every_analysis_runs_at_smoke_size(name, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [f"{name}.py"])
    load(name).main(["--smoke", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == f"analyses/{name}.py"
    assert any(tmp_path.glob("*.csv"))
