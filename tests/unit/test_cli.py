"""The attnprobe command, run in-process (main) and once as a real subprocess."""

import subprocess
import sys

import pandas as pd
import pytest

from attnprobe import load_maps
from attnprobe.cli import main


def test_models_lists_reference_models_and_families(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "ref:transformer" in out and "minilm" in out and "llama" in out


def test_extract_writes_maps_and_prints_a_summary(tmp_path, capsys):
    out = tmp_path / "maps.npz"
    code = main(["extract", "--model", "ref:transformer", "--text", "the cat sat on the mat",
                 "--text", "a dog", "--scope", "heads:1.0,1.2", "--quiet", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "L1H2" in printed and "entropy" in printed and "L0H0" not in printed
    maps = load_maps(out)
    assert [m.shape for m in maps] == [(1, 2, 7, 7), (1, 2, 3, 3)]


def test_extract_to_a_tidy_table(tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat\n\na dog ran\n")
    out = tmp_path / "maps.csv"
    assert main(["extract", "--model", "ref:encoder", "--text-file", str(texts),
                 "--out", str(out)]) == 0
    frame = pd.read_csv(out)
    assert set(frame.example_id) == {0, 1}
    sums = frame.groupby(["example_id", "layer", "head", "query_pos"]).weight.sum()
    assert sums.between(1 - 1e-5, 1 + 1e-5).all()


@pytest.mark.parametrize("argv, message", [
    (["extract", "--model", "ref:encoder", "--text", "  "], "text 0 is empty"),
    (["extract", "--model", "ref:encoder"], "no text"),
    (["extract", "--model", "no/such/model", "--text", "hi"], "not found"),
    (["extract", "--model", "ref:nope", "--text", "hi"], "unknown reference model"),
    (["extract", "--model", "ref:encoder", "--text", "the cat", "--scope", "layer:5"],
     "out of range"),
    (["extract", "--model", "ref:encoder", "--text", "the cat", "--scope", "*.9"], "out of range"),
    (["extract", "--model", "ref:encoder", "--text", "the " * 100], "at most"),
    (["extract", "--model", "ref:encoder", "--text-file", "/no/file"], "not found"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "m.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnprobe: error:") and message in err and "\n" not in err


def test_truncate_cuts_to_the_model_limit(tmp_path):
    out = tmp_path / "m.npz"
    assert main(["extract", "--model", "ref:encoder", "--text", "the " * 100, "--truncate",
                 "--out", str(out)]) == 0
    (amap,) = load_maps(out)
    assert amap.shape[-1] == 64  # the reference encoder's max_len


def test_console_script_exit_code():
    bad = subprocess.run([sys.executable, "-m", "attnprobe.cli", "extract", "--model",
                          "ref:encoder", "--text", ""], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


@pytest.mark.parametrize("argv", [
    ["extract", "--scope", "a"], ["extract", "--scope", "layers:0-99999999"],
    ["extract", "--show", "0"],
    ["extract", "--show", "-1"], [], ["extract", "--text", "hi", "--out", "maps.txt"],
])
def test_usage_errors_are_one_line(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse exits by itself
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("attnprobe: error:") and err.count("\n") == 1


def test_unwritable_out_fails_before_the_run(capsys):
    code = main(["extract", "--model", "ref:encoder", "--text", "the cat",
                 "--out", "/proc/no/such/maps.npz"])
    captured = capsys.readouterr()
    assert code == 2 and "entropy" not in captured.out and captured.err.count("\n") == 1
