"""A corpus in which no attention row sees more than one key (every text one token: 1 x 1
maps) says nothing about any head (issue 24, item 12): labelling it is a one-line error, not
every head called ``sink`` from the lone key's weight of 1."""

from __future__ import annotations

import pandas as pd
import pytest

import attnprobe as ap
from attnprobe.errors import InputError
from tests.helpers import run_cli
from tests.integration.causal_lms import save_lm

MESSAGE = "no attention row of the corpus sees more than one key"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return save_lm("gpt2", tmp_path_factory.mktemp("gpt2"))  # adds no special token


@pytest.mark.parametrize("argv", [["--text", "w4"], ["--ids", "0"]])
def test_heads_on_one_token_texts_is_a_one_line_error(argv, gpt2, tmp_path, capsys):
    out = tmp_path / "heads.csv"
    code, _, err = run_cli(["heads", "--model", gpt2, *argv, "--text", "w5",
                            "--out", str(out), "--quiet"], capsys)
    assert code == 2 and err.count("\n") == 1 and MESSAGE in err, err
    assert not out.exists()


def test_one_longer_text_is_enough(gpt2, tmp_path, capsys):
    out = tmp_path / "heads.csv"
    code, _, err = run_cli(["heads", "--model", gpt2, "--text", "w4", "--text", "w5 w6",
                            "--no-repeated", "--out", str(out), "--quiet"], capsys)
    assert code == 0, err
    assert len(pd.read_csv(out)) == 2 * 4  # layers x heads


def test_classify_stored_one_key_maps():
    model, tok = ap.load_model("ref:transformer")
    maps = ap.extract(model, tok, [[5], [6]])  # token ids, one each: [1, 1] maps per layer
    assert all(m.pattern.shape[-2:] == (1, 1) for m in maps)
    with pytest.raises(InputError, match=MESSAGE):
        ap.heads.classify(maps)
    wider = ap.extract(model, tok, [[5], [6, 7]])
    assert len(ap.heads.classify(wider))
