"""reports/build_reports.py on a fake runs/ folder; report_from_maps on saved maps."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import attnprobe as ap
from attnprobe.report.from_files import report_from_maps

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reports_mod():
    spec = importlib.util.spec_from_file_location("build_reports",
                                                  ROOT / "reports" / "build_reports.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["build_reports"] = mod
    spec.loader.exec_module(mod)
    return mod


def _write(folder: Path, tables: dict[str, pd.DataFrame]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        frame.to_csv(folder / f"{name}.csv", index=False)
    return folder


def _labels() -> pd.DataFrame:
    rows = []
    names = ["sink", "previous", "syntactic", "heterogeneous"]
    for layer in range(2):
        for head in range(2):
            rows.append({"stack": "encoder.layer", "kind": "self", "layer": layer, "head": head,
                         "head_id": f"L{layer}H{head}", "label": names[2 * layer + head],
                         "evidence": "fake", "also": "", "entropy": 1.0 + head,
                         "entropy_norm": 0.5, "max_weight": 0.6, "distance": 2.0,
                         "first": 0.3, "special": 0.4, "prev": 0.2, "self": 0.1, "next": 0.1,
                         "syntax_accuracy": 0.5, "dep_alignment": 0.2})
    return pd.DataFrame(rows)


def _syntax() -> pd.DataFrame:
    return pd.DataFrame({"relation": ["det", "<amod>"], "count": [30, 25],
                         "direction": ["dep->head", "head->dep"],
                         "stack": ["encoder.layer"] * 2, "kind": ["self"] * 2,
                         "layer": [1, 0], "head": [0, 1], "head_id": ["L1H0", "L0H1"],
                         "accuracy": [0.8, 0.6], "baseline": [0.5, 0.4],
                         "baseline_offset": [1, -1], "margin": [0.3, 0.2]})


def _fake_runs(root: Path) -> Path:
    runs = root / "runs"
    (runs / "head_census" / "20260101T000000Z").mkdir(parents=True)  # empty: an aborted run
    _write(runs / "head_census" / "20250101T000000Z", {"labels": _labels().head(1)})
    _write(runs / "head_census" / "20251231T000000Z", {
        "labels": _labels(), "syntax_key": _syntax(), "syntax": _syntax(),
        "label_counts": pd.DataFrame({"label": ["sink"], "heads": [1], "share": [0.25],
                                      "layers": ["0"]}),
        "summary": pd.DataFrame({"item": ["sentences"], "value": [3.0]})})
    _write(runs / "perturbation_studies" / "20251231T000000Z", {
        "permutation_summary": pd.DataFrame({
            "task": ["contains"], "model": ["bilstm-classifier"], "layer": [0],
            "measure": ["tvd"], "n_examples": [10], "median_max_attention": [0.2],
            "median_median_change": [0.01], "p90_median_change": [0.9], "share_small": [0.5],
            "n_peaked": [3], "share_small_peaked": [0.0], "mean_flip_rate": [0.3],
            "spearman_max_attention_change": [0.8]}),
        "erasure_summary": pd.DataFrame({
            "task": ["contains"], "model": ["bilstm-classifier"], "order": ["attention"],
            "n_examples": [10], "share_never_flip": [0.5], "median_frac_erased": [0.2]}),
        "pruning_summary": pd.DataFrame({
            "task": ["contains"], "model": ["transformer-classifier"], "order": ["importance"],
            "metric_unpruned": [1.0], "metric_all_pruned": [0.5], "drop": [0.1],
            "share_prunable": [0.75], "heads_prunable": [3], "heads_total": [4]}),
        "training": pd.DataFrame({"task": ["contains"], "model": ["bilstm-classifier"],
                                  "train_accuracy": [1.0], "held_out_accuracy": [1.0],
                                  "final_loss": [0.01], "steps": [40]})})
    _write(runs / "rollout_trend" / "20251231T000000Z", {
        "trend": pd.DataFrame({"view": ["raw", "raw"], "layer": [0, 1],
                               "reference": ["saliency"] * 2, "family": ["input gradients"] * 2,
                               "mean_rho": [-0.6, 0.1], "std": [0.1, 0.2],
                               "frac_significant": [0.7, 0.0], "n": [5, 5]}),
        "verdict": pd.DataFrame({"view": ["raw"], "reference": ["saliency"],
                                 "family": ["input gradients"], "rho_first": [-0.6],
                                 "rho_last": [0.1], "expected": ["drops after the first layer"],
                                 "shown": [False]}),
        "checks": pd.DataFrame({"check": ["sentences explained"], "value": [5.0]})})
    return runs


def test_build_reports_from_runs(tmp_path, reports_mod, capsys):
    runs = _fake_runs(tmp_path)
    out = tmp_path / "_build"
    assert reports_mod.main(["--runs", str(runs), "--out", str(out)]) == 0
    expected = {
        "head_census": ["sec-model", "sec-heads", "sec-profile", "sec-syntax",
                        "sec-label-counts", "sec-summary", "sec-source"],
        "perturbation_studies": ["sec-perturbation", "sec-erasure", "sec-pruning",
                                 "sec-training"],
        "attribution": ["sec-comparison", "sec-verdict", "sec-checks"],
    }
    for name, ids in expected.items():
        page = (out / f"{name}.html").read_text(encoding="utf-8")
        assert "http" not in page, name
        for sec in ids:
            assert f'id="{sec}"' in page, (name, sec)
    census = (out / "head_census.html").read_text(encoding="utf-8")
    assert "20251231T000000Z" in census  # the newest run that has the tables
    assert "&lt;amod&gt;" in census and "<amod>" not in census  # cells are escaped
    assert 'id="sec-adversarial"' not in (out / "perturbation_studies.html").read_text()


def test_build_reports_skips_absent_runs(tmp_path, reports_mod, capsys):
    runs = tmp_path / "runs"
    _write(runs / "rollout_trend" / "20251231T000000Z",
           {"trend": pd.DataFrame({"view": ["raw"], "layer": [0], "mean_rho": [0.1]})})
    out = tmp_path / "_build"
    reports_mod.main(["--runs", str(runs), "--out", str(out), "head_census", "attribution"])
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("skip head_census:") for line in lines)
    assert (out / "attribution.html").is_file()
    assert not (out / "head_census.html").exists()
    with pytest.raises(SystemExit):
        reports_mod.main(["--runs", str(runs), "nope"])


def test_attribution_truth_run(tmp_path, reports_mod):
    run = _write(tmp_path / "attribution_truth" / "20251231T000000Z", {
        "truth": pd.DataFrame({"task": ["contains"], "model": ["bilstm-classifier"],
                               "source": ["raw@L0"], "auroc": [0.9]}),
        "jain_wallace": pd.DataFrame({"task": ["contains"], "model": ["bilstm-classifier"],
                                      "comparison": ["attention vs gradient"],
                                      "tau_mean": [0.2]})})
    page = reports_mod.attribution(run).html
    assert 'id="sec-comparison"' in page and 'id="sec-jain-wallace"' in page


def test_report_from_maps_round_trip(tmp_path):
    torch.manual_seed(0)
    tokens = ("[CLS]", "the", "zebra<b>", "sleeps", "[SEP]")
    pattern = torch.softmax(torch.randn(2, 2, len(tokens), len(tokens)), dim=-1)
    info = ap.ModelInfo(name="tiny-random", arch="BertModel", n_layers=2, n_heads=2,
                        causal=False)
    amap = ap.AttentionMap(pattern=pattern, query_tokens=tokens, key_tokens=tokens,
                           layers=(0, 1), info=info, example_id="s0")
    path = ap.save_maps([amap], tmp_path / "maps.npz")
    report = report_from_maps(path)
    page = report.html
    assert 'id="sec-attention"' in page and 'id="sec-model"' in page
    assert "tiny-random" in page and "zebra" in page and "sleeps" in page
    assert "zebra<b>" not in page  # escaped
    assert "http" not in page
    saved = report.save(tmp_path / "out" / "report.html")
    assert saved.read_text(encoding="utf-8") == page
