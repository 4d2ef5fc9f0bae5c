"""Issue 24 items 2 and 21: metric token names are read as the model reads them mid-sentence
(``logit_diff: c, s`` is ``Ġc`` / ``Ġs`` on byte-level BPE, ``▁c`` / ``▁s`` on SentencePiece,
``cat`` on WordPiece), in every command and API, and the tables record the resolved tokens;
a callable of the logits alone is accepted. Every expected id is resolved here by hand with
the tokenizer (the spaced text, or the vocabulary), every expected number read off plain
forwards."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import attnprobe as ap
from attnprobe.core.metric import parse_metric
from attnprobe.errors import InputError
from tests.helpers import bert_tokenizer, bert_vocab
from tests.helpers import run_cli as run
from tests.integration.bpe_models import bpe_lm, gpt2_tokenizer, llama_tokenizer, save_bpe_lm

# equal token lengths on the GPT-2 style tokenizer (checked in the fixture)
CLEAN = "The cat sat on the mat and the dog ran"
CORRUPT = "The dog sat on the mat and the cat ran"


@pytest.fixture(scope="module")
def gpt2():
    tok = gpt2_tokenizer()
    return bpe_lm("gpt2", tok), tok


@pytest.fixture(scope="module")
def llama():
    return llama_tokenizer()


def spaced_id(tok, name: str) -> int:
    """The one id of `` name`` as the tokenizer encodes it after a space."""
    ids = tok(" " + name, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, ids
    return ids[0]


def fake_output(vocab: int):
    logits = torch.randn(2, 4, vocab, generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": torch.zeros(2, 4, dtype=torch.long),
             "attention_mask": torch.ones(2, 4, dtype=torch.long)}
    return logits, batch


def test_byte_level_bpe_reads_names_with_their_leading_space(gpt2):
    _, tok = gpt2
    c, s = spaced_id(tok, "c"), spaced_id(tok, "s")
    assert tok.convert_ids_to_tokens([c, s]) == ["Ġc", "Ġs"]
    assert (c, s) != (tok.get_vocab()["c"], tok.get_vocab()["s"])  # the bug's tokens differ
    metric = parse_metric("logit_diff: c, s", tok)
    assert metric.spec == "logit_diff:Ġc,Ġs" and metric.token_ids == {"Ġc": c, "Ġs": s}
    logits, batch = fake_output(len(tok))
    torch.testing.assert_close(metric(logits, batch), logits[:, -1, c] - logits[:, -1, s])
    assert parse_metric("logit:c", tok).token_ids == {"Ġc": c}


def test_sentencepiece_reads_names_with_the_word_start_mark(llama):
    tok = llama
    c = tok.get_vocab()["▁c"]
    assert tok.get_vocab()["c"] != c  # the bug read this one
    metric = parse_metric("logit_diff: c, s", tok)
    assert metric.token_ids == {"▁c": c, "▁s": tok.get_vocab()["▁s"]}
    assert metric.spec == "logit_diff:▁c,▁s"


def test_wordpiece_has_no_mark_and_reads_the_word_as_written():
    tok = bert_tokenizer(bert_vocab())
    assert parse_metric("logit: cat ", tok).token_ids == {"cat": tok.get_vocab()["cat"]}


def test_exact_vocabulary_strings_and_ids_keep_working(gpt2):
    _, tok = gpt2
    vocab = tok.get_vocab()
    # the vocabulary string of the spaced token, and the unspaced one by its id
    both = parse_metric(f"logit_diff:Ġc,{vocab['c']}", tok)
    assert both.token_ids == {"Ġc": vocab["Ġc"], str(vocab["c"]): vocab["c"]}
    _, ref = ap.load_model("ref:induction")
    assert parse_metric("logit:t55", ref).spec == "logit:t55"
    assert parse_metric("logit:t55", ref).token_ids == {"t55": ref.get_vocab()["t55"]}


def test_a_name_of_several_tokens_is_an_error_naming_its_pieces(gpt2):
    _, tok = gpt2
    pieces = tok.tokenize(" Paris")
    assert len(pieces) > 1
    with pytest.raises(InputError, match=f"is {len(pieces)} tokens, not one") as err:
        parse_metric("logit_diff:Paris,Rome", tok)
    assert all(repr(p) in str(err.value) for p in pieces) and "\n" not in str(err.value)
    with pytest.raises(InputError, match="needs two tokens"):
        parse_metric("logit_diff:a,b,c", tok)


def by_hand(model, tok, text: str, c: int, s: int) -> float:
    """``logit(c) - logit(s)`` at the last position of a plain forward."""
    ids = tok(text, return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    return float(logits[0, -1, c] - logits[0, -1, s])


def test_every_api_reads_the_spaced_tokens(gpt2):
    model, tok = gpt2
    assert len(tok(CLEAN)["input_ids"]) == len(tok(CORRUPT)["input_ids"])
    c, s = spaced_id(tok, "c"), spaced_id(tok, "s")
    clean, corrupt = by_hand(model, tok, CLEAN, c, s), by_hand(model, tok, CORRUPT, c, s)
    tolerance = dict(rel=1e-5, abs=1e-5)  # float32: batched forwards differ in the ~6th digit
    patched = ap.patch.heads(model, tok, [CLEAN], [CORRUPT], "logit_diff: c, s")
    assert set(patched["metric"]) == {"logit_diff:Ġc,Ġs"}
    assert patched.attrs["metric_ids"] == {"Ġc": c, "Ġs": s}
    assert patched["clean"].iloc[0] == pytest.approx(clean, **tolerance)
    assert patched["corrupt"].iloc[0] == pytest.approx(corrupt, **tolerance)
    perturbed = ap.perturb.run(model, tok, [CLEAN], "uniform", metric="logit_diff: c, s")
    assert set(perturbed["metric"]) == {"logit_diff:Ġc,Ġs"}
    assert perturbed.attrs["metric_ids"] == {"Ġc": c, "Ġs": s}
    assert perturbed["baseline"].iloc[0] == pytest.approx(clean, **tolerance)
    dla = ap.heads.logit_attribution(model, tok, [CLEAN], "logit_diff: c, s")
    assert set(dla.totals["metric"]) == {"logit_diff:Ġc,Ġs"}
    assert dla.totals["value"].iloc[0] == pytest.approx(clean, **tolerance)


def test_the_command_line_reads_the_spaced_tokens(gpt2, tmp_path, capsys):
    model, tok = gpt2
    folder = save_bpe_lm("gpt2", tmp_path / "gpt2", tok)
    c, s = spaced_id(tok, "c"), spaced_id(tok, "s")
    out = tmp_path / "heads.csv"
    code, _, err = run(["patch", "--model", str(folder), "--experiment", "heads", "--clean", CLEAN,
                        "--corrupt", CORRUPT,
                        "--metric", "logit_diff: c, s", "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    assert set(table["metric"]) == {"logit_diff:Ġc,Ġs"}
    assert table["clean"].iloc[0] == pytest.approx(by_hand(model, tok, CLEAN, c, s),
                                                   rel=1e-5, abs=1e-5)


def test_a_callable_of_the_logits_alone_is_accepted():
    logits, batch = fake_output(8)
    metric = parse_metric(lambda logits: logits[:, -1, 3] - logits[:, -1, 5])
    assert metric.spec == "custom"
    torch.testing.assert_close(metric(logits, batch), logits[:, -1, 3] - logits[:, -1, 5])
    both = parse_metric(lambda output, batch: output[:, 0, 1])
    torch.testing.assert_close(both(logits, batch), logits[:, 0, 1])


@pytest.mark.parametrize("fn", [lambda: 0, lambda a, b, c: 0, lambda logits, *, k: 0])
def test_a_callable_of_another_shape_is_refused_saying_what_it_receives(fn):
    with pytest.raises(InputError, match=r"receives \(output, batch\)") as err:
        parse_metric(fn)
    assert "\n" not in str(err.value)


def test_a_logits_callable_runs_in_patching_and_perturbation():
    lm, tok = ap.load_model("ref:induction")
    clean, corrupt = ["t01 t02 t03 t01 t02"], ["t04 t05 t03 t01 t02"]
    t03 = tok.get_vocab()["t03"]
    with torch.no_grad():
        want = float(lm(**tok(clean))[0, -1, t03])  # the reference model returns the logits

    def metric(logits):
        return logits[:, -1, t03]

    table = ap.patch.heads(lm, tok, clean, corrupt, metric)
    assert table["clean"].iloc[0] == pytest.approx(want, rel=1e-5, abs=1e-5)
    perturbed = ap.perturb.run(lm, tok, clean, "uniform", metric=metric)
    assert perturbed["baseline"].iloc[0] == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_a_compare_target_names_its_token_by_the_same_rule(gpt2):
    from attnprobe.attribution.targets import parse_target

    model, tok = gpt2
    assert parse_target("next-token: c", model, tok).spec == f"next-token:{spaced_id(tok, 'c')}"


def _masked_lm():
    import transformers

    from tests.helpers import tiny_bert_config

    vocab = bert_vocab()
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(tiny_bert_config(vocab)).eval(), bert_tokenizer(vocab)


@pytest.mark.parametrize(("family", "name", "token"), [
    ("llama", "c", "▁c"), ("bert", "cat", "cat")])
def test_sentencepiece_and_wordpiece_models_read_the_hand_resolved_token(llama, family, name,
                                                                         token):
    model, tok = (bpe_lm("llama", llama), llama) if family == "llama" else _masked_lm()
    text = "the cat sat on a mat"
    want_id = tok.get_vocab()[token]
    ids = tok(text, return_tensors="pt")
    with torch.no_grad():
        want = float(model(**ids).logits[0, -1, want_id])
    table = ap.perturb.run(model, tok, [text], "uniform", metric=f"logit: {name}")
    assert set(table["metric"]) == {f"logit:{token}"}
    assert table.attrs["metric_ids"] == {token: want_id}
    assert table["baseline"].iloc[0] == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_a_word_the_tokenizer_reads_as_unknown_is_an_error():
    from tests.integration.causal_lms import word_tokenizer

    with pytest.raises(InputError, match="'nonsense' is not in the tokenizer's vocabulary"):
        parse_metric("logit:nonsense", word_tokenizer(bos=False))
