"""A tab makes a sentence pair only for tokenizers with a pair template (issue 24, item 13):
BERT's ``[CLS] a [SEP] b [SEP]`` stays; GPT-2 (no template: the pair was glued, the tab lost)
and LLaMA (its pair is two single texts: a second ``<s>``) keep the tab as text."""

from __future__ import annotations

import pytest

from attnprobe import load_maps
from attnprobe.core.tokens import has_pair_template
from attnprobe.inputs.text import encode
from tests.helpers import bert_tokenizer, bert_vocab, run_cli, tiny_bert
from tests.integration.bpe_models import bpe_lm, bpe_tokenizer, save_bpe_lm

TEXT = "x\ty"


@pytest.fixture(scope="module")
def lms():
    found = {}
    for style in ("gpt2", "llama"):
        tok = bpe_tokenizer(style)
        found[style] = (bpe_lm(style, tok), tok)
    return found


def test_pair_templates():
    assert has_pair_template(bert_tokenizer(bert_vocab()))


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_the_tab_is_kept_without_a_pair_template(style, lms):
    model, tok = lms[style]
    assert not has_pair_template(tok)
    batch = encode(model, tok, [TEXT, "x y"])
    expected = tok(TEXT)["input_ids"]  # the tokenizer's own encoding of the whole text
    assert "token_type_ids" not in batch
    assert batch["input_ids"][0, :len(expected)].tolist() == expected
    assert int(batch["attention_mask"][0].sum()) == len(expected)
    tab = tok.convert_tokens_to_ids(tok.tokenize("\t"))[-1]
    assert tab in expected  # by hand: the tab's own token is there
    if style == "llama":
        assert expected.count(tok.bos_token_id) == 1


def test_bert_still_encodes_a_pair():
    vocab = bert_vocab()
    model, tok = tiny_bert(vocab), bert_tokenizer(vocab)
    batch = encode(model, tok, ["the cat\tsat on a mat"])
    pair = tok("the cat", "sat on a mat")
    assert batch["input_ids"][0].tolist() == pair["input_ids"]
    assert batch["token_type_ids"][0].tolist() == pair["token_type_ids"]


def test_cli_keeps_the_tab_on_gpt2(lms, tmp_path, capsys):
    _, tok = lms["gpt2"]
    folder = save_bpe_lm("gpt2", tmp_path / "gpt2", tok)
    out = tmp_path / "maps.npz"
    code, _, err = run_cli(["extract", "--model", str(folder), "--text", TEXT, "--out",
                            str(out), "--quiet"], capsys)
    assert code == 0, err
    (amap,) = load_maps(out)
    assert list(amap.query_ids) == tok(TEXT)["input_ids"]
