"""``attnprobe perturb`` in-process: tables with RUN_COLUMNS, a summary, one-line errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from attnprobe.perturb.experiments import RUN_COLUMNS
from tests.helpers import run_cli as run

CLASSIFIER = ["--model", "ref:transformer-classifier"]
TEXTS = ["--text", "the cat sat on the red mat", "--text", "a dog ran to the tree"]




def test_uniform_writes_a_csv_with_run_columns_and_prints_a_summary(tmp_path, capsys):
    out = tmp_path / "results.csv"
    code, printed, err = run(["perturb", *CLASSIFIER, *TEXTS, "--experiment", "uniform",
                              "--scope", "layer:1", "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    assert tuple(table.columns) == RUN_COLUMNS
    assert set(table["scope"]) == {"layer:1"} and set(table["example_id"]) == {0, 1}
    assert "median change per perturbation and metric" in printed
    assert "uniform" in printed and "tvd" in printed
    assert "perturb uniform" in err and f"wrote {len(table)} rows" in err  # progress bar


def test_permute_from_a_text_file_to_json_quietly(tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat on the mat\n\na big red dog\n")
    out = tmp_path / "permute.json"
    code, printed, err = run(["perturb", "--model", "ref:bilstm-classifier", "--text-file",
                              str(texts), "--experiment", "permute", "--permutations", "5",
                              "--seed", "2", "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    assert err == ""
    rows = json.loads(out.read_text())
    assert len({r["example_id"] for r in rows}) == 2
    assert json.loads(rows[0]["params"]) == {"n_permutations": 5, "seed": 2}
    assert "tvd_median" in printed and "max_attention" in printed


def test_erase_with_k_writes_steps(tmp_path, capsys):
    out = tmp_path / "erase.csv"
    code, _, err = run(["perturb", *CLASSIFIER, "--text", "the cat sat on the mat",
                        "--experiment", "erase", "--k", "2", "--rankings", "attention,random",
                        "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    assert sorted(table["step"].dropna().unique().tolist()) == [1, 2]
    assert {"flipped", "fraction_to_flip"} <= set(table["metric"])


def test_default_model_minilm_uniform_on_one_layer(tmp_path, capsys):
    out = tmp_path / "minilm.csv"
    code, _, err = run(["perturb", "--text", "The cat sat on the mat.", "--experiment",
                        "uniform", "--scope", "head:0.3", "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    assert set(table["metric"]) == {"cosine_distance", "l2_distance"}
    assert (table["perturbed"] > 0).all()


@pytest.mark.parametrize(("argv", "message"), [
    (["--experiment", "nope"], "unknown experiment 'nope'; choose one of ablate"),
    (["--experiment", "uniform", "--scope", "layer:9"], "layers [9] out of range"),
    (["--experiment", "uniform", "--scope", "head:0.5"], "heads [5] out of range"),
    (["--experiment", "uniform", "--scope", "lay:1"], "scope 'lay:1'"),
    (["--experiment", "adversarial", "--eps", "0"], "expected a finite number > 0; got 0"),
    (["--experiment", "adversarial", "--eps", "-0.1"], "expected a finite number > 0"),
    (["--experiment", "adversarial", "--eps", "nan"], "expected a finite number > 0"),
    (["--experiment", "uniform", "--eps", "0.1"], "--eps applies to --experiment adversarial"),
    (["--experiment", "permute", "--permutations", "0"], "expected a number >= 1"),
    (["--experiment", "erase", "--rankings", "gradient"], "unknown erase ranking 'gradient'"),
    (["--experiment", "mean"], "transformers"),
    (["--experiment", "uniform", "--out", "x.txt"], "--out must end in"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    argv = ["perturb", *CLASSIFIER, "--text", "the cat sat", "--quiet", "--out",
            str(tmp_path / "r.csv"), *argv]
    code, _, err = run(argv, capsys)
    assert code == 2
    err = err.strip()
    assert err.startswith("attnprobe: error:") and message in err and "\n" not in err


def test_no_text_is_an_error(capsys):
    code, _, err = run(["perturb", *CLASSIFIER, "--experiment", "uniform"], capsys)
    assert code == 2 and "no text" in err


def test_help_has_examples(capsys):
    code, printed, _ = run(["perturb", "--help"], capsys)
    assert code == 0
    assert "attnprobe perturb --model ref:bilstm-classifier" in printed
    assert "--experiment" in printed and "heads:0.2,1.8" in printed
