"""Token ids on the command line (issue 17): ``--ids "2 14 15"`` (repeatable) and
``--ids-file`` on every corpus command, through the real argument parser; texts that give
nothing but special tokens are the same one-line error from every command."""

from __future__ import annotations

import pandas as pd
import pytest

import attnprobe as ap
from attnprobe import load_maps
from tests.helpers import run_cli, saved_tiny_bert

MODEL = "ref:transformer"  # its WordTokenizer puts [BOS] (id 2) first


@pytest.fixture(scope="module")
def ref():
    return ap.load_model(MODEL)


def test_extract_takes_ids_and_ids_files_after_the_texts(ref, tmp_path, capsys):
    _, tok = ref
    ids = tok.encode("the cat sat")
    (tmp_path / "ids.txt").write_text(f"{' '.join(map(str, ids[1:]))}\n\n  5,6 7  \n")
    out = tmp_path / "maps.npz"
    code, _, err = run_cli(["extract", "--model", MODEL, "--text", "the cat sat",
                            "--ids", " ".join(map(str, ids)), "--ids-file",
                            str(tmp_path / "ids.txt"), "--out", str(out), "--quiet"], capsys)
    assert code == 0, err
    maps = load_maps(out)
    assert [m.example_id for m in maps] == ["0", "1", "2", "3"]
    assert [m.query_ids for m in maps] == [tuple(ids), tuple(ids), tuple(ids[1:]), (5, 6, 7)]
    # the text and its ids as given are one input: the same map
    assert (maps[0].pattern - maps[1].pattern).abs().max().item() <= 1e-6


def test_a_table_gets_the_id_columns(tmp_path, capsys):
    out = tmp_path / "maps.csv"
    code, _, err = run_cli(["extract", "--model", MODEL, "--ids", "2 14 15", "--scope",
                            "layer:0", "--out", str(out), "--quiet"], capsys)
    assert code == 0, err
    frame = pd.read_csv(out)
    assert sorted(set(frame.query_id)) == [2, 14, 15] and sorted(set(frame.key_id)) == [2, 14, 15]


@pytest.mark.parametrize("command", [
    ["heads", "--no-repeated"],
    ["perturb", "--experiment", "ablate", "--sweep", "head"],
])
def test_corpus_commands_take_ids(command, tmp_path, capsys):
    out = tmp_path / "out.csv"
    code, _, err = run_cli([command[0], "--model", MODEL, "--ids", "2 14 15 16", "--ids",
                            "2 17", *command[1:], "--out", str(out), "--quiet"], capsys)
    assert code == 0, err
    assert len(pd.read_csv(out))


@pytest.mark.parametrize("argv, message", [
    (["--ids", "2 x 3"], "'x' is not a token id"),
    (["--ids", "2 -3"], "'-3' is not a token id"),
    (["--ids", "  "], "--ids holds no token id"),
    (["--ids", "2 99999"], "text 0 holds token id 99999, outside the model's vocabulary"),
    (["--ids-file", "IDS"], "IDS line 2: 'y' is not a token id"),
    (["--ids-file", "/no/such/file"], "ids file not found"),
])
def test_bad_ids_are_one_line_errors(argv, message, tmp_path, capsys):
    (tmp_path / "ids.txt").write_text("2 14\n2 y\n")
    argv = [str(tmp_path / "ids.txt") if a == "IDS" else a for a in argv]
    message = message.replace("IDS", str(tmp_path / "ids.txt"))
    code, _, err = run_cli(["extract", "--model", MODEL, *argv, "--out",
                            str(tmp_path / "m.npz")], capsys)
    assert code == 2
    assert message in err and err.startswith("attnprobe: error:") and err.count("\n") == 1


def test_ids_cannot_be_mixed_with_trees(tmp_path, capsys):
    (tmp_path / "t.conllu").write_text("1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_\n"
                                       "2\tcat\tcat\tNOUN\tNN\t_\t0\troot\t_\t_\n\n")
    code, _, err = run_cli(["heads", "--model", MODEL, "--conllu", str(tmp_path / "t.conllu"),
                            "--ids", "2 14"], capsys)
    assert code == 2 and "--conllu cannot be combined" in err


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return saved_tiny_bert(tmp_path_factory.mktemp("bert"))


@pytest.mark.parametrize("invisible", ["\u200b", "\ufeff", "\u0301", "\x01"])
def test_a_text_of_only_special_tokens_is_one_message_from_every_command(bert_dir, invisible,
                                                                         tmp_path, capsys):
    """``heads`` used to label every head from ``[CLS] [SEP]`` alone while ``compare``
    refused the same text."""
    commands = [["extract"], ["heads"], ["compare", "--target", "similarity:the cat"],
                ["perturb", "--experiment", "ablate"]]
    errors = set()
    for i, command in enumerate(commands):
        code, _, err = run_cli([*command, "--model", bert_dir, "--text", "the cat", "--text",
                                invisible, "--out", str(tmp_path / f"out{i}.csv")], capsys)
        assert code == 2
        errors.add(err)
    assert len(errors) == 1
    (err,) = errors
    assert "text 1 (" in err and "gives no token besides the tokenizer's special tokens " \
        "([CLS] [SEP])" in err and err.count("\n") == 1
