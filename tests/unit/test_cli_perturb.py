"""``attnprobe perturb`` in-process: tables with RUN_COLUMNS, a summary, one-line errors."""

from __future__ import annotations

import json
import resource

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
    assert tuple(table.columns) == RUN_COLUMNS  # uniform has no options: no parameter columns
    assert set(table["scope"]) == {"layer:1"} and set(table["example_id"]) == {0, 1}
    assert set(table["layer"]) == {1} and table["head"].isna().all()
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
    assert {k: rows[0][k] for k in ("n_permutations", "seed")} == {"n_permutations": 5,
                                                                    "seed": 2}
    assert "tvd_median" in printed and "max_attention" in printed


def test_erase_with_max_erased_writes_steps(tmp_path, capsys):
    out = tmp_path / "erase.csv"
    code, _, err = run(["perturb", *CLASSIFIER, "--text", "the cat sat on the mat",
                        "--experiment", "erase", "--max-erased", "2", "--rankings",
                        "attention,random", "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    assert sorted(table["step"].dropna().unique().tolist()) == [1, 2]
    assert {"flipped", "fraction_to_flip"} <= set(table["metric"])
    assert set(table["ranking"]) == {"attention", "random"}
    assert set(table["max_erased"]) == {2}


def test_the_cli_table_equals_the_api_table(tmp_path, capsys):
    """The flags are the dataclass options: the CLI run is the API run with those keywords."""
    from attnprobe.models import build_reference
    from attnprobe.perturb import run as api_run

    out = tmp_path / "dirichlet.csv"
    code, _, err = run(["perturb", *CLASSIFIER, *TEXTS, "--experiment", "dirichlet",
                        "--draws", "6", "--alpha", "0.5", "--seed", "3", "--batch-size", "4",
                        "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    model, tok = build_reference("transformer-classifier")
    expected = api_run(model, tok, [TEXTS[1], TEXTS[3]], "dirichlet", n_draws=6, alpha=0.5,
                       seed=3, batch_size=4)
    got = pd.read_csv(out, dtype={"example_id": str})
    for column in ("layer", "head", "step", "n_draws", "seed"):
        got[column] = got[column].astype("Int64")
    pd.testing.assert_frame_equal(got, expected, rtol=1e-12)


def test_a_head_sweep_writes_one_row_per_head_and_prints_a_layer_by_head_grid(tmp_path,
                                                                             capsys):
    out = tmp_path / "sweep.csv"
    code, printed, err = run(["perturb", *CLASSIFIER, *TEXTS, "--experiment", "ablate",
                              "--sweep", "head", "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    assert tuple(table.columns) == RUN_COLUMNS
    assert len(table) == 2 * 2 * 2 * 4  # layers x heads x texts x metrics
    tvd = table[table["metric"] == "tvd"]
    lines = printed.splitlines()
    assert lines[0].endswith("each head alone: median tvd change per head")
    assert lines[1] == "(rows: layers, columns: heads; jsd, flip, top_prob are in the table)"
    assert lines[2].split() == ["head", "0", "1"] and lines[3].split() == ["layer"]
    for layer in (0, 1):  # the grid holds the medians over the two texts, as written
        cells = [float(x) for x in lines[4 + layer].split()[1:]]
        expected = [tvd[(tvd["layer"] == layer) & (tvd["head"] == head)]["change"].median()
                    for head in (0, 1)]
        assert int(lines[4 + layer].split()[0]) == layer
        assert cells == pytest.approx(expected, rel=1e-2)
    assert len(lines) == 6 and max(len(line) for line in lines) <= 100


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
    (["--experiment", "adversarial", "--eps", "0"], "eps must be a finite number > 0; got 0.0"),
    (["--experiment", "adversarial", "--eps", "-0.1"], "eps must be a finite number > 0"),
    (["--experiment", "adversarial", "--eps", "nan"], "eps must be a finite number > 0"),
    (["--experiment", "adversarial", "--eps", "x"], "expected a number; got 'x'"),
    (["--experiment", "uniform", "--eps", "0.1"], "--eps applies to --experiment adversarial, "
                                                  "not uniform"),
    (["--experiment", "permute", "--alpha", "2"], "--alpha applies to --experiment dirichlet,"
                                                  " not permute"),
    (["--experiment", "dirichlet", "--permutations", "5"], "--permutations applies to "
                                                           "--experiment permute, not dirichlet"),
    (["--experiment", "importance", "--max-erased", "2"], "--max-erased applies to "
                                                          "--experiment erase"),
    (["--experiment", "erase", "--k", "2"], "unrecognized arguments: --k"),
    (["--experiment", "permute", "--permutations", "0"],
     "n_permutations must be an integer >= 1; got 0"),
    (["--experiment", "permute", "--permutations", "2.5"], "expected a whole number; got '2.5'"),
    (["--experiment", "importance", "--prune-steps", "0"], "prune_steps must be an integer >= 1"),
    (["--experiment", "erase", "--rankings", "gradient"], "unknown erase ranking 'gradient'"),
    (["--experiment", "mean"], "transformers"),
    (["--experiment", "permute", "--sweep", "head"], "'permute' does not sweep"),
    (["--experiment", "ablate", "--sweep", "heads"], "invalid choice: 'heads'"),
    (["--experiment", "uniform", "--out", "x.txt"], "--out must end in"),
    # flags that would change nothing (issue 17: --target was ignored by uniform)
    (["--experiment", "uniform", "--target", "class:0"],
     "perturb uniform does not read target 'class:0': it measures the change of the whole "
     "output"),
    (["--experiment", "permute", "--target", "class:1"], "perturb permute does not read target"),
    (["--experiment", "erase", "--rankings", "attention,random", "--target", "class:0"],
     "the rankings attention, random read none"),
    (["--experiment", "erase", "--rankings", "attention", "--n-steps", "5"],
     "n_steps changes nothing here"),
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
    # every option of every experiment's parameter dataclass is a flag that names its owner
    from dataclasses import fields

    from attnprobe.core.options import option_flag
    from attnprobe.perturb import EXPERIMENTS, params_of

    flat = " ".join(printed.split())
    for name in EXPERIMENTS.names():
        for f in fields(params_of(name)):
            flag = option_flag(f.name, f.metadata)
            assert f" {flag} " in flat, flag
            assert f"{name}: {f.metadata['help']}" in flat or f"/{name}: " in flat, flag


# ----------------------------------------------------------------------------- memory budget
def _one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    err = err.strip()
    assert err.startswith("attnprobe: error:") and "\n" not in err, err
    return err


def test_a_huge_number_of_permutations_is_refused_fast_without_allocating(tmp_path, capsys):
    """Fault 3: ``--permutations 100000000`` was OOM-killed. The distances a median needs
    (8 bytes per draw and metric) are estimated before the first forward."""
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    code, _, err = run(["perturb", "--model", "ref:bilstm-classifier", "--text", "the cat sat",
                        "--experiment", "permute", "--permutations", str(10**12), "--quiet",
                        "--out", str(tmp_path / "p.csv")], capsys)
    err = _one_line_error(code, err)
    assert "n_permutations (--permutations) = 1000000000000" in err
    assert "lower n_permutations (--permutations) to" in err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 512 * 1024
    assert not (tmp_path / "p.csv").exists()


GIB = 2**30


def test_the_faults_hundred_million_permutations_on_a_2_gib_machine(tmp_path, capsys,
                                                                      monkeypatch):
    from attnprobe.perturb import budget

    monkeypatch.setattr(budget, "available_bytes", lambda device="cpu": 2 * GIB)
    code, _, err = run(["perturb", "--model", "ref:bilstm-classifier", "--text", "the cat sat",
                        "--experiment", "permute", "--permutations", "100000000", "--quiet",
                        "--out", str(tmp_path / "p.csv")], capsys)
    err = _one_line_error(code, err)
    # 10**8 draws x 3 distances x 8 bytes = 2.4e9 bytes, over 80 % of 2 GiB
    assert "holds about 2.24 GiB of results per text" in err
    most = int(err.split("to ")[-1].split(" or less")[0])
    assert 0 < most < 10**8 and most * 24 <= 0.8 * 2 * GIB


def test_a_forward_beyond_the_budget_says_which_batch_size_fits(tmp_path, capsys, monkeypatch):
    from attnprobe.perturb import budget

    monkeypatch.setattr(budget, "available_bytes", lambda device="cpu": 2 * 2**20)
    argv = ["perturb", *CLASSIFIER, "--text", "the cat sat on the red mat", "--experiment",
            "permute", "--permutations", "256", "--quiet", "--out", str(tmp_path / "p.csv")]
    from attnprobe.models import build_reference

    _, tok = build_reference("transformer-classifier")
    n_tokens = len(tok(["the cat sat on the red mat"])["input_ids"][0])
    code, _, err = run([*argv, "--batch-size", "256"], capsys)
    err = _one_line_error(code, err)
    assert f"a forward of 256 rows x {n_tokens} tokens" in err
    most = int(err.split("set batch_size (--batch-size) to ")[1].split(" ")[0])
    assert 16 <= most < 256
    code, _, err = run([*argv, "--batch-size", str(most + 1)], capsys)
    assert code == 2 and f"a forward of {most + 1} rows" in err
    code, _, err = run([*argv, "--batch-size", str(most)], capsys)
    assert code == 0, err
    # the default batching (16 rows) keeps the forward within this budget
    code, _, err = run(argv, capsys)
    assert code == 0, err


# ----------------------------------------------------------------------------- issue 17
def test_a_huge_batch_size_on_one_short_text_is_one_row(tmp_path, capsys):
    # `--batch-size 200000` on "The cat sat." was refused as a forward of 200000 rows
    out = tmp_path / "u.csv"
    code, _, err = run(["perturb", *CLASSIFIER, "--text", "the cat sat", "--experiment",
                        "uniform", "--batch-size", str(10**8), "--quiet", "--out", str(out)],
                       capsys)
    assert code == 0, err
    assert set(pd.read_csv(out)["example_id"]) == {0}


@pytest.mark.parametrize(("experiment", "flag"), [("permute", "--permutations"),
                                                  ("dirichlet", "--draws")])
def test_draws_show_a_bar_over_every_draw_with_the_time_left(experiment, flag, tmp_path,
                                                             capsys):
    # `--permutations 100000000` ran for days with a bar over texts that never moved
    code, _, err = run(["perturb", "--model", "ref:bilstm-classifier", *TEXTS, "--experiment",
                        experiment, flag, "30", "--batch-size", "8", "--out",
                        str(tmp_path / "p.csv")], capsys)
    assert code == 0, err
    assert f"perturb {experiment}" in err and "60/60" in err and "draw" in err
    assert "<00:00" in err  # the time left, once the last draw is done


# ----------------------------------------------------------------------------- issue 18
LM = ["--model", "ref:transformer"]  # a causal reference LM, [BOS] first


def test_a_knockout_with_a_metric_writes_the_api_table(tmp_path, capsys):
    from attnprobe.models import build_reference
    from attnprobe.perturb import knockout

    out = tmp_path / "knockout.csv"
    code, printed, err = run(["perturb", *LM, *TEXTS, "--experiment", "knockout", "--edges",
                              "to:0", "--metric", "logit:next", "--positions", "all",
                              "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    got = pd.read_csv(out, dtype={"example_id": str})
    assert tuple(got.columns) == (*RUN_COLUMNS, "edges", "positions")
    assert set(got["metric"]) == {"logit:next"} and set(got["edges"]) == {"to:0"}
    assert "logit:next" in printed
    model, tok = build_reference("transformer")
    expected = knockout(model, tok, [TEXTS[1], TEXTS[3]], "to:0", metric="logit:next",
                        positions="all")
    for column in ("layer", "head", "step"):
        got[column] = got[column].astype("Int64")
    pd.testing.assert_frame_equal(got, expected, rtol=1e-12)


def test_a_metric_on_an_ablation_sweep_prints_its_grid(tmp_path, capsys):
    out = tmp_path / "sweep.csv"
    code, printed, err = run(["perturb", *LM, *TEXTS, "--experiment", "ablate", "--sweep",
                              "head", "--metric", "logit_diff:cat,dog", "--positions", "-1",
                              "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out, dtype={"positions": str})
    assert set(table["metric"]) == {"logit_diff:cat,dog"} and set(table["positions"]) == {"-1"}
    assert printed.splitlines()[0].endswith("median logit_diff:cat,dog change per head")


@pytest.mark.parametrize(("argv", "message"), [
    (["--experiment", "knockout", "--edges", "towards:0"],
     "unknown edges kind 'towards'; choose one of 'edge', 'from', 'last-to', 'to'"),
    (["--experiment", "knockout", "--edges", "to:x"], "'x' is not a position"),
    (["--experiment", "knockout", "--edges", "to:9"], "position 9 is out of range for a text"),
    (["--experiment", "knockout"], "knockout needs edges= (CLI --edges)"),
    (["--experiment", "uniform", "--edges", "to:0"], "--edges applies to --experiment knockout"),
    # the last token: no earlier query of a causal LM can read it, and its own edge is kept
    (["--experiment", "knockout", "--edges", "to:-1"],
     "knockout 'to:-1' blocks no edge of scope all that text 0 could see"),
    (["--experiment", "knockout", "--edges", "edge:0>0"], "a row needs a key left"),
    (["--experiment", "knockout", "--edges", "to:0", "--metric", "logit:zzqq"],
     "metric logit:zzqq: 'zzqq' is not in the tokenizer's vocabulary"),
    (["--experiment", "uniform", "--metric", "logits:cat"], "unknown metric kind 'logits'"),
    (["--experiment", "uniform", "--metric", "logit:next"], "the last position has no next"),
    (["--experiment", "uniform", "--positions", "all"],
     "positions changes nothing with the default metric"),
    (["--experiment", "uniform", "--metric", "loss", "--positions", "first"],
     "--positions must be 'last', 'all' or integers"),
    (["--experiment", "erase", "--metric", "loss"], "perturb erase does not take metric 'loss'"),
    (["--experiment", "uniform", "--metric", "loss", "--output", "lm"],
     "output='lm' chooses what the default metric"),
])
def test_knockout_and_metric_errors_are_one_line(argv, message, tmp_path, capsys):
    argv = ["perturb", *LM, "--text", "the cat sat", "--quiet", "--out",
            str(tmp_path / "r.csv"), *argv]
    code, _, err = run(argv, capsys)
    err = _one_line_error(code, err)
    assert message in err
