"""``analyses/gpu_check.py --device cpu --smoke``: capture equals the eager twin within the
rounding of one probability to bf16, the census, patching and DLA ran on every head, the
flash path says why it was skipped, and the markdown is written; tests marked ``cuda`` are
skipped here, each with its reason."""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pandas as pd
import pytest
import torch

from tests.conftest import CUDA_SKIP

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_smoke_on_cpu(tmp_path):
    gpu_check = importlib.import_module("gpu_check")
    gpu_check.main(["--device", "cpu", "--smoke", "--out", str(tmp_path)])
    cfg = gpu_check.Config.smoke()
    heads = cfg.shape["layers"] * cfg.shape["heads"]
    checks = pd.read_csv(tmp_path / "checks.csv").set_index("check")
    value, passed = checks["value"], checks["passed"]

    sdpa = "capture = eager (sdpa path)"
    # the worst difference over its bound u·max(p, p') (bf16: u = 2^-8) may not exceed 1
    assert passed[sdpa] == 1 and checks.loc[sdpa, "ratio_to_bound"] <= 1
    assert value[sdpa] <= 2.0**-8
    flash = "capture = eager (flash_attention_2 path)"
    assert math.isnan(passed[flash]) and checks.loc[flash, "note"].startswith("skipped")

    assert value["census: heads scored"] == heads
    assert passed["census: mean entropies within [0, ln(tokens)]"] == 1
    assert value["patch.heads: table rows"] == heads  # scope "all": one row per head
    assert value["patch.heads: finite effects"] == heads
    assert value["logit_attribution: head rows"] == 2 * heads  # two texts
    assert checks["passed"].dropna().eq(1).all()

    timing = pd.read_csv(tmp_path / "timing.csv")
    assert list(timing["analysis"]) == ["capture (ap.extract)", "census", "patch.heads",
                                        "logit_attribution"]
    assert (timing["seconds"] > 0).all() and (timing["baseline_s"] > 0).all()
    assert timing["ratio"].to_numpy() == pytest.approx(
        (timing["seconds"] / timing["baseline_s"]).to_numpy())
    info = pd.read_csv(tmp_path / "info.csv")
    assert info.loc[0, "device"] == "cpu" and info.loc[0, "dtype"] == "bf16"
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "| capture = eager (sdpa path) |" in markdown and "| census |" in markdown


def test_gpu_check_refuses_cuda_without_a_device(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    gpu_check = importlib.import_module("gpu_check")
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        gpu_check.main(["--device", "cuda", "--smoke", "--out", str(tmp_path)])


def test_cuda_tests_are_skipped_with_their_reason(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the cuda tests run")
    report = tmp_path / "cuda.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--junitxml={report}", "tests/integration/test_cuda.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:]
    cases = ElementTree.parse(report).getroot().iter("testcase")
    reasons = {case.get("name"): [s.get("message") for s in case.iter("skipped")]
               for case in cases}
    defined = [line[4:line.index("(")] for line in (ROOT / "tests/integration/test_cuda.py")
               .read_text().splitlines() if line.startswith("def test_")]
    assert sorted(reasons) == sorted(defined) and defined
    assert all(found == [CUDA_SKIP] for found in reasons.values()), reasons
