"""``attnprobe patch`` through the real command line: tables with the documented columns, a
summary on stdout, one-line errors with exit code 2."""

from __future__ import annotations

import json
from dataclasses import fields

import pandas as pd
import pytest

from attnprobe.patch import COLUMNS, PATH_COLUMNS
from tests.helpers import run_cli as run

MODEL = ["--model", "ref:induction"]
CLEAN = "t01 t02 t03 t04 t05 t01 t02 t03 t04"  # [BOS] first: the copy starts at position 6
CORRUPT = "t09 t08 t07 t06 t05 t01 t02 t03 t04"
PAIR = ["--clean", CLEAN, "--corrupt", CORRUPT, "--metric", "logit:next",
        "--metric-positions", "6,7,8"]


def test_heads_writes_the_table_and_prints_the_mean_effect_per_head(tmp_path, capsys):
    out = tmp_path / "heads.csv"
    code, printed, err = run(["patch", *MODEL, "--experiment", "heads", *PAIR,
                              "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    assert tuple(table.columns) == COLUMNS and len(table) == 8
    assert set(table["direction"]) == {"denoising"} and set(table["site"]) == {"output"}
    assert "mean effect per patch, largest first" in printed and "effect" in printed
    assert f"wrote {len(table)} rows" in err


def test_files_noising_each_position_to_json(tmp_path, capsys):
    clean, corrupt = tmp_path / "clean.txt", tmp_path / "corrupt.txt"
    clean.write_text(f"{CLEAN}\n\n{CLEAN}\n")
    corrupt.write_text(f"{CORRUPT}\n{CLEAN.replace('t01 t02', 't11 t12', 1)}\n")
    out = tmp_path / "each.json"
    code, _printed, err = run(["patch", *MODEL, "--experiment", "heads", "--clean-file",
                              str(clean), "--corrupt-file", str(corrupt), "--metric",
                              "logit:next", "--metric-positions", "6,7,8", "--scope",
                              "layer:1", "--site", "v", "--positions", "each", "--direction",
                              "noising", "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    assert err == ""
    rows = json.loads(out.read_text())
    assert len(rows) == 2 * 4 * 10  # examples x heads x positions
    assert {r["site"] for r in rows} == {"v"} and {r["direction"] for r in rows} == {"noising"}


def test_path_into_keys_adds_the_path_columns(tmp_path, capsys):
    out = tmp_path / "path.csv"
    code, _printed, err = run(["patch", *MODEL, "--experiment", "path", *PAIR, "--senders",
                              "layer:0", "--receivers", "layer:1", "--into", "k,q", "--out",
                              str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    assert tuple(table.columns) == (*COLUMNS, *PATH_COLUMNS)
    assert set(table["into"]) == {"k,q"} and set(table["receivers"]) == {"layer:1"}
    assert list(table["sender_head"]) == [0, 1, 2, 3]


def test_ids_and_attribution_compared_with_real_patching(tmp_path, capsys):
    out = tmp_path / "attribution.csv"
    clean = "2 5 6 7 8 9 5 6 7 8"  # [BOS] t01 .. as ids
    corrupt = "2 13 12 11 10 9 5 6 7 8"
    code, printed, err = run(["patch", *MODEL, "--experiment", "attribution", "--clean-ids",
                              clean, "--corrupt-ids", corrupt, "--metric", "logit:next",
                              "--metric-positions", "6,7,8", "--compare", "--out", str(out)],
                             capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    assert list(dict.fromkeys(table["experiment"])) == ["attribution", "heads"]
    assert "attribution vs activation patching over 8 patches: Pearson" in printed


@pytest.mark.parametrize(("argv", "message"), [
    (["--experiment", "heads", "--clean", CLEAN, "--corrupt", "t01 t02", "--metric",
      "logit:next"], "tokenize to 10 and 3 tokens"),
    (["--experiment", "heads", "--clean", CLEAN, "--metric", "logit:next"],
     "no text: pass --corrupt"),
    (["--experiment", "path", *PAIR, "--site", "q"], "--site applies to --experiment "
                                                     "attribution/heads, not path"),
    (["--experiment", "path", *PAIR, "--receivers", "layer:1", "--scope", "layer:0"],
     "takes --senders and --receivers, not --scope"),
    (["--experiment", "heads", *PAIR, "--compare"], "--compare applies to --experiment "
                                                    "attribution"),
    (["--experiment", "path", *PAIR], "needs receivers=SCOPE"),
    (["--experiment", "knockout", *PAIR], "unknown experiment 'knockout'"),
    (["--experiment", "path", *PAIR, "--receivers", "layer:1", "--into", "z"],
     "unknown into 'z'"),
    (["--experiment", "heads", *PAIR[:-2], "--metric-positions", "first"],
     "--metric-positions must be"),
    (["--experiment", "heads", *PAIR[:-2]], "has no next token"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    code, _printed, err = run(["patch", *MODEL, *argv, "--out", str(tmp_path / "t.csv")],
                             capsys)
    assert code == 2
    last = err.strip().splitlines()[-1]  # after the progress bar, when a forward ran
    assert last.startswith("attnprobe: error:") and message in last, err
    assert not (tmp_path / "t.csv").exists()


@pytest.mark.parametrize("command", ["patch", "report"])
def test_help_names_the_experiments_of_each_option_once(capsys, command):
    """``--receivers`` used to read "path: path: the receiver heads"."""
    from attnprobe.patch import EXPERIMENTS, params_of

    code, printed, _ = run([command, "--help"], capsys)
    assert code == 0
    flat = " ".join(printed.split())
    assert "path: the receiver heads (a scope; required) (default none)" in flat
    assert "--senders SCOPE path: the sender heads (a scope) (default all)" in flat
    for name in EXPERIMENTS.names():
        assert f"{name}: {name}:" not in flat, name
        assert f"/{name}: {name}:" not in flat, name
    assert all(not f.metadata["help"].startswith(f"{name}:")
               for name in EXPERIMENTS.names() for f in fields(params_of(name)))


@pytest.mark.parametrize("stream", ["resid_pre", "resid_mid"])
def test_residual_equals_the_python_table_and_prints_intervals(tmp_path, capsys, stream):
    import attnprobe as ap

    out = tmp_path / "resid.csv"
    code, printed, err = run(["patch", *MODEL, "--experiment", "residual", "--stream", stream,
                              *PAIR, "--clean", CLEAN.replace("t01", "t11", 1), "--corrupt",
                              CORRUPT, "--ci", "0.9", "--n-boot", "50", "--seed", "4",
                              "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out, dtype={"example_id": str})
    model, tok = ap.load_model("ref:induction")
    want = ap.patch.residual(model, tok, [CLEAN, CLEAN.replace("t01", "t11", 1)],
                             [CORRUPT, CORRUPT], "logit:next", stream=stream,
                             metric_positions=[6, 7, 8])
    assert tuple(table.columns) == COLUMNS and len(table) == len(want) == 2 * 2 * 10
    assert set(table["site"]) == {stream} and table["head"].isna().all()
    assert list(table["layer"]) == list(want["layer"])
    assert list(table["position"]) == list(want["position"])
    # the CSV keeps 17 significant digits: the same floats
    assert (table["patched"].to_numpy() == want["patched"].to_numpy()).all()
    header = next(line for line in printed.splitlines() if "effect" in line and "ci_low" in line)
    assert "ci_high" in header


@pytest.mark.parametrize(("argv", "message"), [
    (["--experiment", "mlp", *PAIR], "no MLP (attention-only)"),
    (["--experiment", "heads", *PAIR, "--stream", "resid_mid"],
     "--stream applies to --experiment residual, not heads"),
    (["--experiment", "residual", *PAIR, "--stream", "mlp_out"], "unknown stream 'mlp_out'"),
    (["--experiment", "residual", *PAIR, "--scope", "head:0.1"], "covers whole layers"),
    (["--experiment", "residual", *PAIR, "--ci", "1.5"], "ci is a confidence level"),
])
def test_residual_and_mlp_refusals_are_one_line(tmp_path, capsys, argv, message):
    code, _printed, err = run(["patch", *MODEL, *argv, "--out", str(tmp_path / "t.csv")],
                             capsys)
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("attnprobe: error:") and message in last, err
    assert not (tmp_path / "t.csv").exists()
