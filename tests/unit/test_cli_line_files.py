"""Line files split at ``\\n`` (and ``\\r\\n``) only (issue 24, item 3): the characters
``str.splitlines`` also breaks at (U+2028, U+2029, form feed, vertical tab, NEL, U+001C-U+001E)
stay inside their text, through the real command line (``--text-file``, ``--ids-file``,
``--clean-file`` / ``--corrupt-file``) and the CoNLL-U reader."""

from __future__ import annotations

import pandas as pd
import pytest

from attnprobe import load_maps
from attnprobe.core.lines import read_lines, split_lines
from attnprobe.heads.trees import read_conllu
from tests.helpers import run_cli

# every character str.splitlines breaks at besides \n and \r
BREAKS = ("\u2028", "\u2029", "\x0c", "\x0b", "\x85", "\x1c", "\x1d", "\x1e")
MODEL = "ref:transformer"  # its WordTokenizer splits words at any whitespace


def test_split_lines_breaks_at_newlines_only():
    inside = "".join(BREAKS)
    text = f"a{inside}b\r\nc\n\nd{inside}"
    assert split_lines(text) == [f"a{inside}b", "c", "", f"d{inside}"]
    assert split_lines(text + "\n") == split_lines(text)  # a final line end adds no line
    for sep in BREAKS:
        assert len(f"x{sep}y".splitlines()) == 2  # what the old reader did
        assert split_lines(f"x{sep}y") == [f"x{sep}y"]


def test_read_lines_numbers_the_non_blank_lines(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes("\ufeffone\u2028two\r\n\n  three \n".encode())
    assert read_lines(path) == [(1, "one\u2028two"), (3, "three")]


@pytest.mark.parametrize("sep", BREAKS)
def test_text_file_lines_are_the_texts(sep, tmp_path, capsys):
    lines = [f"the cat{sep}sat on the mat", "a dog ran"]
    texts = tmp_path / "texts.txt"
    texts.write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")
    from_file, from_args = tmp_path / "file.npz", tmp_path / "args.npz"
    code, _, err = run_cli(["extract", "--model", MODEL, "--text-file", str(texts),
                            "--out", str(from_file), "--quiet"], capsys)
    assert code == 0, err
    code, _, err = run_cli(["extract", "--model", MODEL, *[a for t in lines for a in
                                                          ("--text", t)],
                            "--out", str(from_args), "--quiet"], capsys)
    assert code == 0, err
    found, expected = load_maps(from_file), load_maps(from_args)
    assert [m.example_id for m in found] == ["0", "1"]
    assert [m.query_ids for m in found] == [m.query_ids for m in expected]


def test_ids_file_lines_keep_their_numbers(tmp_path, capsys):
    ids = tmp_path / "ids.txt"
    ids.write_text("2 14\u2028 15\n\n2 x\n", encoding="utf-8")
    code, _, err = run_cli(["extract", "--model", MODEL, "--ids-file", str(ids),
                            "--out", str(tmp_path / "m.npz"), "--quiet"], capsys)
    assert code == 2 and err.strip().endswith(f"{ids} line 3: 'x' is not a token id "
                                              "(a whole number >= 0)"), err
    ids.write_text("2 14\u2028 15\n2 16\n", encoding="utf-8")
    out = tmp_path / "m.npz"
    code, _, err = run_cli(["extract", "--model", MODEL, "--ids-file", str(ids),
                            "--out", str(out), "--quiet"], capsys)
    assert code == 0, err
    assert [m.query_ids for m in load_maps(out)] == [(2, 14, 15), (2, 16)]


def test_clean_and_corrupt_files_pair_line_by_line(tmp_path, capsys):
    clean, corrupt = tmp_path / "clean.txt", tmp_path / "corrupt.txt"
    clean.write_text("t01 t02\u2028t03 t04 t01 t02\nt05 t06 t07 t08 t05 t06\n",
                     encoding="utf-8")
    corrupt.write_text("t09 t02\u2029t03 t04 t01 t02\nt05 t06 t07 t08 t09 t06\n",
                       encoding="utf-8")
    out = tmp_path / "p.csv"
    code, _, err = run_cli(["patch", "--model", "ref:induction", "--experiment", "heads",
                            "--clean-file", str(clean), "--corrupt-file", str(corrupt),
                            "--metric", "logit:next", "--metric-positions", "3,4",
                            "--out", str(out), "--quiet"], capsys)
    assert code == 0, err
    assert sorted(set(pd.read_csv(out)["example_id"].astype(str))) == ["0", "1"]


def test_conllu_word_keeps_a_line_separator():
    text = ("# text = a\u2028b c\n"
            "1\ta\u2028b\t_\tNOUN\t_\t_\t0\troot\t_\t_\n"
            "2\tc\t_\tNOUN\t_\t_\t1\tdep\t_\t_\n")
    (tree,) = read_conllu(text)
    assert tree.words == ("a\u2028b", "c")
