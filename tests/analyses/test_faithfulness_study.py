"""analyses/faithfulness_study.py and analyses/bench_faithfulness.py at smoke size: every model
is scored with the random baseline, the induction prompts' copy source is the token after the
earlier occurrence of the last token (resolved here with the tokenizer) and is what the model
predicts, the leaderboard markdown holds one table per model, and the benchmark's baseline
pool reproduces evaluate()'s table (no timing is asserted)."""

import importlib
import json
import sys

import pandas as pd
import torch

import attnprobe as ap


def test_faithfulness_study_smoke(tmp_path, monkeypatch):
    study = importlib.import_module("faithfulness_study")
    monkeypatch.setattr(sys, "argv", ["faithfulness_study.py"])
    study.main(["--smoke", "--out", str(tmp_path)])
    cfg = study.Config.smoke()
    models = pd.read_csv(tmp_path / "models.csv")
    names = ["induction", *(f"truth:{t}" for t in cfg.truth_tasks), "minilm",
             "minilm:query=mean", "classifier"]
    assert models["model"].tolist() == names
    board = pd.read_csv(tmp_path / "leaderboard.csv")
    for name, texts in zip(names, models["texts"], strict=True):
        part = board[board["model"] == name]
        assert "random" in set(part["source"])
        assert (part["n"] == texts).all()  # every source scored on every text
        assert sorted(part["rank"]) == sorted(part["aopc_comprehensiveness"].rank(
            ascending=False, method="min").astype(int))
        low, mean, high = (part[f"aopc_comprehensiveness{s}"] for s in ("_low", "", "_high"))
        assert ((low <= mean + 1e-12) & (mean <= high + 1e-12)).all()
    # BERT models: every registered view and method reads them; the own LLaMA layout of
    # ref:induction is refused by value zeroing and norm, and the refusal is recorded
    minilm = set(board.loc[board["model"] == "minilm", "source"])
    assert {"attn_lrp", "integrated_gradients", "value_zeroing@L1", "alti@L1"} <= minilm
    assert "value_zeroing" in models.loc[models["model"] == "induction", "not_supported"].iloc[0]
    # the mean-row variant: the views and the one method evaluate() needs, read at "mean"
    mean = board[board["model"] == "minilm:query=mean"]
    assert set(mean["source_kind"]) == {"attention", "attribution", "random"}
    assert set(mean.loc[mean["source_kind"] == "attribution", "source"]) == {"saliency"}
    assert models.loc[models["model"] == "minilm:query=mean", "view_query"].iloc[0] == "mean"

    model, tok = ap.load_model("ref:induction")
    prompts = pd.read_csv(tmp_path / "induction_prompts.csv")
    assert len(prompts) == cfg.n_induction
    for text, source in zip(prompts["text"], prompts["copy_source"], strict=True):
        ids = tok(text, return_tensors="pt")["input_ids"][0].tolist()
        earlier = ids.index(ids[-1])  # the first occurrence of the last token
        assert earlier < len(ids) - 1 and source == earlier + 1
        with torch.no_grad():
            assert int(model(torch.tensor([ids]))[0, -1].argmax()) == ids[source]
    truth = pd.read_csv(tmp_path / "truth.csv")
    lengths = [tok(t, return_tensors="pt")["input_ids"].shape[-1] for t in prompts["text"]]
    chance = sum(1 / (n - 2) for n in lengths) / len(lengths)  # [BOS] and the last excluded
    assert abs(truth["chance"].iloc[0] - chance) <= 1e-12
    assert set(truth["source"]) == set(board.loc[board["model"] == "induction", "source"]) \
        - {"random"}
    for column in ("copy_source_top1", "match_or_source_top1"):  # shares of the prompts
        assert ((truth[column] * cfg.n_induction).round(9) % 1 == 0).all()
    assert (truth["match_or_source_top1"] >= truth["copy_source_top1"]).all()

    text = (tmp_path / "leaderboard.md").read_text()
    assert all(f"**{name}**" in text for name in names) and text.count("| rank |") == len(names)
    assert "copy source top-1" in text
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/faithfulness_study.py" and record["config"]


def test_bench_faithfulness_smoke(tmp_path, monkeypatch):
    bench = importlib.import_module("bench_faithfulness")
    monkeypatch.setattr(sys, "argv", ["bench_faithfulness.py"])
    bench.main(["--smoke", "--out", str(tmp_path)])
    cfg = bench.Config.smoke()
    checks = pd.read_csv(tmp_path / "checks.csv").set_index("check")["value"]
    assert checks["texts"] == cfg.n_sentences
    assert checks["sources (plus the random baseline)"] == len(cfg.methods) + len(cfg.views)
    assert checks["table rows only one side has"] == 0
    # the same float32 forwards in batches of the same shapes: equal up to rounding
    assert checks["max |evaluate - baseline pool| table value"] <= 1e-5
    summary = pd.read_csv(tmp_path / "summary.csv")
    row = summary.iloc[0]
    assert abs(row["baseline_s"] - row["sources_s"] - row["pool_forward_s"]) <= 1e-9
    assert row["ratio (evaluate / baseline)"] > 0
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["script"] == "analyses/bench_faithfulness.py" and record["config"]
