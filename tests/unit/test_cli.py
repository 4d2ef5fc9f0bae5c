"""The attnprobe command, run in-process (main) and once as a real subprocess."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import attnprobe
from attnprobe import load_maps
from attnprobe.cli import main
from tests.helpers import fresh_python, run_cli, saved_tiny_bert


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


# Start-up held at one import (the time torch takes to load, made as long as the test needs):
# a sitecustomize on PYTHONPATH runs before the command, as in a terminal.
SLOW_START = """
import os, signal, sys, time

signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's `&` would ignore Ctrl-C


class HoldImport:
    def find_spec(self, name, path=None, target=None):
        marker = os.environ["HOLD_MARKER"]
        if name == os.environ["HOLD_IMPORT"] and not os.path.exists(marker):
            open(marker, "w").close()  # the test sends Ctrl-C now
            time.sleep(120)
        return None


sys.meta_path.insert(0, HoldImport())
"""


@pytest.mark.parametrize(("command", "held"), [
    ("script", "torch"),  # while `import attnprobe` loads torch
    ("module", "attnprobe.commands.heads"),  # while the command modules load
])
def test_ctrl_c_while_the_command_starts_is_one_line_and_exit_130(command, held, tmp_path):
    # a traceback through the imports and exit -2 (killed by SIGINT) before
    script = Path(sys.executable).with_name("attnprobe")
    if command == "script" and not script.exists():
        pytest.skip("the attnprobe console script is not installed next to this python")
    argv = [str(script)] if command == "script" else [sys.executable, "-m", "attnprobe.cli"]
    (tmp_path / "sitecustomize.py").write_text(SLOW_START)
    repo = Path(attnprobe.__file__).resolve().parents[1]
    marker = tmp_path / "held"
    env = {**os.environ, "HOLD_IMPORT": held, "HOLD_MARKER": str(marker),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo),
                                          os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([*argv, "models"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):  # at most 2 minutes for the interpreter to reach that import
            if marker.exists() or process.poll() is not None:
                break
            time.sleep(0.1)
        assert marker.exists(), process.communicate()[1]
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert err == "attnprobe: interrupted\n" and out == ""


def test_importing_attnprobe_in_a_script_leaves_ctrl_c_to_python():
    code = ("import signal, attnprobe, attnprobe.cli; "
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    assert fresh_python(code) == "True"


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


# ------------------------------------------------------------------ outputs (issue 11, fault 2)
EXTRACT = ["extract", "--model", "ref:encoder", "--text", "the cat sat", "--quiet"]


def refused_before_the_run(argv, capsys, message):
    """Exit 2 with one line naming ``message``, and no model ran: no summary printed."""
    code, printed, err = run_cli(argv, capsys)
    assert code == 2, err
    assert err.startswith("attnprobe: error:") and err.count("\n") == 1, err
    assert message in err, err
    assert printed == ""  # the summary table is printed right after the run
    return err


def test_out_npz_and_bertviz_on_its_sidecar_are_refused(tmp_path, capsys):
    refused_before_the_run([*EXTRACT, "--out", str(tmp_path / "m.npz"), "--bertviz",
                            str(tmp_path / "m.json")], capsys,
                           f"--bertviz {tmp_path / 'm.json'} is also the .json sidecar")
    assert list(tmp_path.iterdir()) == []


def test_out_npz_never_overwrites_an_unrelated_json(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "bert"}')
    refused_before_the_run([*EXTRACT, "--out", str(tmp_path / "config.npz")], capsys,
                           f"would overwrite {config}, which is not a sidecar")
    assert config.read_text() == '{"model_type": "bert"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_out_npz_replaces_its_own_earlier_maps(tmp_path, capsys):
    out = tmp_path / "m.npz"
    assert run_cli([*EXTRACT, "--out", str(out)], capsys)[0] == 0
    assert run_cli(["extract", "--model", "ref:encoder", "--text", "a dog ran on the mat",
                    "--quiet", "--out", str(out)], capsys)[0] == 0
    (amap,) = load_maps(out)
    assert amap.query_tokens == ("[BOS]", "a", "dog", "ran", "on", "the", "mat")


@pytest.mark.parametrize(("out", "bertviz", "message"), [
    ("m.npz/", None, "--out {tmp}/m.npz is a directory"),
    ("m.npz", "viz.json/", "--bertviz {tmp}/viz.json is a directory"),
    ("m.npz", "viz/", "--bertviz must end in .json"),
    ("side.npz", None, "the sidecar {tmp}/side.json of an output is a directory"),
    ("t.json", "t.json", "--bertviz and --out both write {tmp}/t.json"),
    ("m.npz", "/proc/no/such/v.json", "--bertviz: cannot write /proc/no/such/v.json"),
])
def test_directory_colliding_and_unwritable_outputs_are_refused(out, bertviz, message,
                                                                 tmp_path, capsys):
    for name in (out, bertviz, "side.json/"):
        if name and name.endswith("/"):
            (tmp_path / name).mkdir()
    argv = [*EXTRACT, "--out", str(tmp_path / out.rstrip("/"))]
    if bertviz:
        argv += ["--bertviz", bertviz if bertviz.startswith("/") else
                 str(tmp_path / bertviz.rstrip("/"))]
    refused_before_the_run(argv, capsys, message.format(tmp=tmp_path))
    assert not any(p.is_file() for p in tmp_path.rglob("*"))  # nothing was written


def test_out_may_not_overwrite_the_text_file(tmp_path, capsys):
    texts = tmp_path / "texts.json"
    texts.write_text("the cat sat\n")
    refused_before_the_run(["extract", "--model", "ref:encoder", "--text-file", str(texts),
                            "--out", str(texts)], capsys,
                           f"--out {texts} is also the --text-file input")
    assert texts.read_text() == "the cat sat\n"


# A process killed while it writes: the write is stopped by SIGKILL half way, as `kill -9`
# (or the OOM killer) would stop it. Only the writer is replaced; the run is the real one.
KILLED_WHILE_WRITING = """
import os, signal, sys
import numpy as np, pandas as pd

def half_then_killed(target, *args, **kwargs):
    if not isinstance(target, (str, os.PathLike)):  # an open file: write where it points
        target = target.name
    with open(target, "ab") as stream:
        stream.write(b"PK\\x03\\x04 half an archive" if str(target).endswith(".npz")
                     else b"example_id,stack,kind,layer\\n0,,self,0\\n")
    os.kill(os.getpid(), signal.SIGKILL)

np.savez_compressed = half_then_killed
pd.DataFrame.to_csv = lambda self, path, **kwargs: half_then_killed(path)
from attnprobe.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("name", ["maps.npz", "maps.csv"])
def test_a_run_killed_while_writing_leaves_the_previous_output(name, tmp_path):
    out = tmp_path / name
    argv = ["extract", "--model", "ref:encoder", "--text", "the cat sat", "--quiet",
            "--out", str(out)]
    assert main(argv) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    killed = subprocess.run([sys.executable, "-c", KILLED_WHILE_WRITING, *argv[:-4],
                             "a dog ran on the mat", *argv[-3:]], capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if not p.name.startswith(".")}
    assert after == before  # the old output, whole; only a hidden .part file is left
    if name.endswith(".npz"):
        assert load_maps(out)[0].query_tokens == ("[BOS]", "the", "cat", "sat")
    else:
        assert set(pd.read_csv(out).query_token) == {"[BOS]", "the", "cat", "sat"}


def test_ctrl_c_while_writing_exits_130_and_keeps_the_old_file(tmp_path, capsys, monkeypatch):
    out = tmp_path / "maps.npz"
    assert run_cli([*EXTRACT, "--out", str(out)], capsys)[0] == 0
    before = out.read_bytes()

    def interrupted(stream, **arrays):
        stream.write(b"PK\x03\x04 half")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez_compressed", interrupted)
    code, _, err = run_cli([*EXTRACT, "--out", str(out)], capsys)
    assert code == 130 and err == "attnprobe: interrupted\n"
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["maps.json", "maps.npz"]


# ------------------------------------------------------------------ messages (fault 9)
@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return saved_tiny_bert(tmp_path_factory.mktemp("bert"))


def test_max_length_below_the_special_tokens_says_it_cannot_be_cut(bert_dir, tmp_path, capsys):
    code, printed, err = run_cli(["extract", "--model", bert_dir, "--text", "the cat sat",
                                  "--max-length", "1", "--truncate", "--quiet",
                                  "--out", str(tmp_path / "m.npz")], capsys)
    assert code == 2 and printed == "" and err.count("\n") == 1
    assert "text 0 cannot be cut to 1 tokens" in err and "raise --max-length" in err
    assert "need at least 3" in err  # [CLS] [SEP] and one word
    assert "pass --truncate" not in err and "--truncate" not in err.split("cut to")[1]


def test_show_0_is_a_usage_error(capsys):
    code, printed, err = run_cli(["extract", "--text", "hi", "--show", "0"], capsys)
    assert code == 2 and printed == ""
    assert err == "attnprobe: error: argument --show: expected a number >= 1; got 0\n"


def test_version_prints_the_version(capsys):
    from attnprobe import __version__

    code, printed, err = run_cli(["--version"], capsys)
    assert code == 0 and printed == f"attnprobe {__version__}\n" and err == ""


@pytest.mark.parametrize("text", ["the cat\t", "\tthe cat", "the cat\t  "])
def test_a_sentence_pair_with_an_empty_half_is_refused(text, bert_dir, tmp_path, capsys):
    refused_before_the_run(["extract", "--model", bert_dir, "--text", "a dog", "--text", text,
                            "--quiet", "--out", str(tmp_path / "m.npz")], capsys,
                           "text 1 is a sentence pair (it has a tab) with an empty half")
    assert not (tmp_path / "m.npz").exists()


@pytest.mark.parametrize("command", [
    ["extract"], ["heads", "--no-repeated"], ["compare", "--target", "class:0"],
    ["perturb", "--experiment", "uniform"], ["report"],
])
def test_no_command_overwrites_its_text_file(command, tmp_path, capsys):
    texts = tmp_path / ("texts.html" if command == ["report"] else "texts.csv")
    texts.write_text("the cat sat\n")
    before = texts.read_bytes()
    code, printed, err = run_cli([*command, "--model", "ref:encoder", "--text-file", str(texts),
                                  "--out", str(texts), "--quiet"], capsys)
    assert code == 2 and err.count("\n") == 1 and "input" in err
    assert texts.read_bytes() == before and printed == ""


def test_a_repeated_scope_merges(tmp_path, capsys):
    out = tmp_path / "maps.npz"
    code, printed, _ = run_cli(["extract", "--model", "ref:encoder", "--text", "the cat sat",
                                "--scope", "head:0.1", "--scope", "L1H2", "--quiet",
                                "--out", str(out)], capsys)
    assert code == 0
    (amap,) = load_maps(out)
    assert amap.layers == (0, 1) and amap.heads == (1, 2)  # the grid holding 0.1 and 1.2
    assert "L0H1" in printed and "L1H2" in printed and "L0H0" not in printed


def test_extract_generate_writes_one_map_per_text_over_the_generated_tokens(tmp_path, capsys):
    from attnprobe import extract, load_model

    out = tmp_path / "generated.npz"
    prompt = "t01 t02 t03 t04 t05 t06 t07 t08 t09 t01 t02"
    assert main(["extract", "--model", "ref:induction", "--text", prompt, "--generate", "4",
                 "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"text 0: [BOS] {prompt} -> t03 t04 t05 t06" in printed
    (amap,) = load_maps(out)  # the prompt length travels in the sidecar
    assert amap.prompt_length == 12 and amap.shape[2:] == (16, 16)
    model, tok = load_model("ref:induction")
    whole = extract(model, tok, [" ".join(amap.query_tokens[1:])])[0]
    assert np.allclose(amap.pattern.numpy(), whole.pattern.numpy(), atol=1e-5)
    sampled = tmp_path / "sampled.npz"
    draws = []
    for seed in ("5", "5", "6"):
        assert main(["extract", "--model", "ref:induction", "--text", prompt, "--generate",
                     "4", "--sample", "--seed", seed, "--quiet", "--out", str(sampled)]) == 0
        draws.append(load_maps(sampled)[0].query_tokens)
        assert draws[-1][:12] == amap.query_tokens[:12] and len(draws[-1]) == 16
    assert draws[0] == draws[1]  # seeded: the same draw twice


@pytest.mark.parametrize("argv, message", [
    (["--model", "ref:encoder", "--text", "the cat", "--generate", "2"], "attends both ways"),
    (["--model", "ref:transformer-classifier", "--text", "the cat", "--generate", "2"],
     "attends both ways"),
    (["--model", "ref:induction", "--text", "t01", "--generate", "0"], "positive integer"),
    (["--model", "ref:induction", "--text", "t01", "--sample"], "--sample needs --generate"),
    (["--model", "ref:induction", "--text", "t01 t02", "--generate", "2047"],
     "with generate=2047 the sequence needs 2050 positions"),
])
def test_extract_generate_bad_input_is_one_line(argv, message, capsys, tmp_path):
    assert main(["extract", *argv, "--out", str(tmp_path / "m.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnprobe: error:") and message in err and "\n" not in err


def test_a_warning_is_one_line_like_an_error(capsys, tmp_path):
    """A probe longer than ref:induction was trained on warns (and runs): the command prints
    the warning as one line, not Python's file/line/source form."""
    code, _, err = run_cli(["heads", "--model", "ref:induction", "--text", "t01 t02 t03 t04",
                            "--probe-length", "30", "--no-similarity", "--quiet",
                            "--out", str(tmp_path / "heads.csv")], capsys)
    assert code == 0
    lines = [line for line in err.splitlines() if "warning" in line]
    assert len(lines) == 1 and lines[0].startswith("attnprobe: warning: probe length 30 ")
    assert ".py:" not in err
