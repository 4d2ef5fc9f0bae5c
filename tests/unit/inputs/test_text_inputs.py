"""Texts as callers give them (issue 17): token ids in every form, kept on the maps; tokenizers
as they ship (no pad token, either padding side), never changed; ids and texts checked
against the model before any forward."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.inputs.text import encode, filler_id
from attnprobe.types import MAP_COLUMNS
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert
from tests.integration.causal_lms import SPECIAL, WORDS, causal_lm, text


def padless(bos: bool, padding_side: str = "right") -> transformers.PreTrainedTokenizerFast:
    """The word tokenizer of ``tests.integration.causal_lms`` as GPT-2 / LLaMA ship theirs:
    no pad token (``<s>`` put first when ``bos``)."""
    vocab = {token: i for i, token in enumerate((*SPECIAL, *WORDS))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos:
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", 1)])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        padding_side=padding_side)


@pytest.fixture(scope="module")
def llama():
    model, _ = causal_lm("llama")
    return model, padless(bos=True)


@pytest.fixture(scope="module")
def gpt2():
    model, _ = causal_lm("gpt2")
    return model, padless(bos=False)


def _same(a: list, b: list, atol: float = 1e-6) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.query_tokens == y.query_tokens and x.query_ids == y.query_ids
        assert (x.pattern - y.pattern).abs().max().item() <= atol


# ---------------------------------------------------------------------------- pad-less tokenizers
def test_a_padless_tokenizer_pads_with_eos_through_the_mask_and_is_left_unchanged(gpt2):
    model, tok = gpt2
    assert tok.pad_token is None
    with pytest.raises(ValueError, match="padding token"):  # what attnprobe used to call
        tok([text(5), text(6, 7)], padding=True)
    batch = encode(model, tok, [text(5), text(6, 7, 8)])
    assert batch["input_ids"].tolist() == [[5, 2, 2], [6, 7, 8]]  # </s> = 2 fills
    assert batch["attention_mask"].tolist() == [[1, 0, 0], [1, 1, 1]]
    left = encode(model, tok, [text(5), text(6, 7, 8)], padding_side="left")
    assert left["input_ids"].tolist() == [[2, 2, 5], [6, 7, 8]]
    assert tok.pad_token is None and tok.padding_side == "right"
    together = ap.extract(model, tok, [text(5, 6), text(7, 8, 9, 10)], batch_size=2)
    _same(together, [ap.extract(model, tok, [t])[0] for t in (text(5, 6), text(7, 8, 9, 10))])
    assert tok.pad_token is None


def test_the_filler_id_is_pad_else_eos_else_unk_else_0_and_fits_the_vocabulary():
    class Tok:
        pad_token_id = None
        eos_token_id = 7
        unk_token_id = 3

    assert filler_id(Tok()) == 7
    assert filler_id(Tok(), vocab=5) == 3  # an eos the model has no row for is skipped
    Tok.eos_token_id = Tok.unk_token_id = None
    assert filler_id(Tok()) == 0
    assert filler_id(bert_tokenizer(bert_vocab())) == 0  # [PAD]


@pytest.mark.parametrize("side", ("right", "left"))
def test_tokenizers_with_a_pad_token_get_the_ids_and_masks_their_own_padding_gives(side):
    vocab = bert_vocab()
    model, tok = tiny_bert(vocab), bert_tokenizer(vocab)
    texts = ["the cat sat", "a dog", "red\tbig red cat", "the\tmat"]
    ours = encode(model, tok, texts[:2], padding_side=side)
    tok.padding_side = side
    theirs = tok(texts[:2], padding=True, return_tensors="pt")
    pairs = tok([t.split("\t")[0] for t in texts[2:]], [t.split("\t")[1] for t in texts[2:]],
                padding=True, return_tensors="pt")
    tok.padding_side = "right"
    for key in ("input_ids", "attention_mask"):
        assert torch.equal(ours[key], theirs[key])
    ours = encode(model, tok, texts[2:], padding_side=side)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(ours[key], pairs[key])


def test_a_left_padding_tokenizer_gives_the_maps_of_a_right_padding_one(llama):
    model, right = llama
    left = padless(bos=True, padding_side="left")
    texts = [text(5, 6, 7, 8), text(9), text(10, 11)]
    _same(ap.extract(model, left, texts), ap.extract(model, right, texts))
    assert left.padding_side == "left"


def test_threads_generating_with_one_tokenizer_never_touch_it(gpt2):
    """``generate`` pads on the left; it used to set ``tokenizer.padding_side`` and restore
    it, which raced between threads sharing the tokenizer."""
    import threading

    model, tok = gpt2
    written = []

    class Watched(type(tok)):
        def __setattr__(self, name, value):
            if name == "padding_side":
                written.append(value)
            super().__setattr__(name, value)

    tok.__class__ = Watched
    errors, out = [], {}

    def run(name, prompts):
        try:
            out[name] = ap.extract(model, tok, prompts, generate=2, batch_size=2)
        except Exception as exc:  # reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=run, args=(k, [text(5, 6), text(7 + k)]))
                   for k in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        tok.__class__ = Watched.__mro__[1]
    assert errors == [] and written == [] and tok.padding_side == "right"
    assert [m.prompt_length for m in out[0]] == [2, 1]


# ------------------------------------------------------------------------------ token ids in
def test_every_form_of_token_ids_gives_the_maps_of_those_ids_as_given(llama):
    model, tok = llama
    rows = [[1, 5, 6, 7], [1, 9]]
    expected = ap.extract(model, tok, [text(5, 6, 7), text(9)])  # <s> added by the tokenizer
    assert [m.query_ids for m in expected] == [tuple(r) for r in rows]
    left = {"input_ids": torch.tensor([[1, 5, 6, 7], [2, 2, 1, 9]]),
            "attention_mask": torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])}
    forms = [rows, [torch.tensor(r) for r in rows], [np.array(r) for r in rows],
             [tuple(r) for r in rows], left,
             {"input_ids": [[1, 5, 6, 7], [1, 9, 0, 0]], "attention_mask": [[1] * 4, [1, 1, 0, 0]]}]
    for form in forms:
        _same(ap.extract(model, tok, form), expected)
    square = ap.extract(model, tok, torch.tensor([[1, 5, 6, 7]]))  # every position is real
    _same(square, expected[:1])
    one = ap.extract(model, tok, tok(text(9)))  # one text's tokenizer output
    _same(one, expected[1:])
    bare = ap.extract(model, tok, [[5, 6, 7]])[0]  # no special token added to ids
    assert bare.query_ids == (5, 6, 7) and bare.query_tokens == ("w5", "w6", "w7")


def test_strings_and_ids_mix_and_keep_their_place_as_example_id(llama):
    model, tok = llama
    maps = ap.extract(model, tok, [text(5), [1, 7, 8], text(9, 10)], batch_size=2)
    assert [m.example_id for m in maps] == ["0", "1", "2"]
    assert [m.query_ids for m in maps] == [(1, 5), (1, 7, 8), (1, 9, 10)]
    strings = ap.extract(model, tok, np.array([text(5), text(9, 10)]))  # an array of strings
    assert [m.query_ids for m in strings] == [(1, 5), (1, 9, 10)]
    by_ids = ap.head_stats(model, tok, [[1, 7, 8]]).summary()
    by_text = ap.head_stats(model, tok, [text(7, 8)]).summary()
    pd.testing.assert_frame_equal(by_ids, by_text)


def test_ids_are_cut_to_their_first_tokens_and_length_checked(llama):
    model, tok = llama
    long = list(range(4, 80))  # 76 ids, 64 positions
    with pytest.raises(InputError, match="text 0 has 76 tokens but the model takes at most 64"):
        ap.extract(model, tok, [long])
    cut = ap.extract(model, tok, [long], truncation="cut")[0]
    assert cut.query_ids == tuple(long[:64])
    kept = ap.extract(model, tok, [long, [5, 6]], truncation="skip")
    assert [m.example_id for m in kept] == ["1"]


def test_maps_keep_their_ids_in_files_and_tables(llama, tmp_path):
    model, tok = llama
    maps = ap.extract(model, tok, [text(5, 6), [8, 9, 10]])
    ap.save_maps(maps, tmp_path / "m.npz")
    back = ap.load_maps(tmp_path / "m.npz")
    assert [m.query_ids for m in back] == [(1, 5, 6), (8, 9, 10)]
    assert [m.key_ids for m in back] == [(1, 5, 6), (8, 9, 10)]
    frame = back[1].to_frame()
    assert list(frame.columns) == [*MAP_COLUMNS, "query_id", "key_id"]
    cells = frame[(frame.query_pos == 2) & (frame.key_pos == 0)]
    assert set(cells.query_id) == {10} and set(cells.key_id) == {8}
    # files written before ids were kept still load, without them
    sidecar = tmp_path / "m.json"
    spec = json.loads(sidecar.read_text())
    for entry in spec["maps"]:
        del entry["query_ids"], entry["key_ids"]
        del entry["info"]["token_style"]
    sidecar.write_text(json.dumps(spec))
    old = ap.load_maps(tmp_path / "m.npz")
    assert [m.query_ids for m in old] == [None, None]
    assert list(old[0].to_frame().columns) == list(MAP_COLUMNS)
    assert torch.equal(old[0].pattern, maps[0].pattern)


@pytest.mark.parametrize("texts, message", [
    (None, "got NoneType"),
    (3, "got int"),
    (b"the cat", "got bytes"),
    ([3, 4], "text 0 is a single int"),
    ([[1.5, 2]], "text 0 holds 1.5"),
    ([[5, -1]], "token id -1"),
    ([[]], "text 0 has no token ids"),
    ([[5], None], "text 1 is NoneType"),
    (torch.ones(2, 3), "float32"),
    (torch.ones(2, 2, 2, dtype=torch.long), "2-D"),
    ({"tokens": [1]}, "needs input_ids"),
    ({"input_ids": [[5, 6]], "attention_mask": [[0, 0]]}, "text 0 has no real token"),
    ({"input_ids": [[5, 6]], "attention_mask": [[1]]}, "does not match"),
    ([], "no text given"),
])
def test_wrong_inputs_are_one_line_input_errors(llama, texts, message):
    model, tok = llama
    with pytest.raises(InputError, match=message) as caught:
        ap.extract(model, tok, texts)
    assert "\n" not in str(caught.value)


def test_ids_the_model_has_no_row_for_are_refused_naming_the_text_and_id(llama):
    model, tok = llama
    with pytest.raises(InputError, match=r"text 1 holds token id 100, outside the model's "
                                         r"vocabulary \(ids 0\.\.99\)"):
        ap.extract(model, tok, [[5], [6, 100]])


@pytest.fixture(scope="module")
def small_gpt2():
    """A GPT-2 whose embedding has 50 rows, with the 100-word tokenizer: a tokenizer larger
    than the model's vocabulary."""
    from tests.integration.hf_models import FAMILIES

    torch.manual_seed(0)
    config = FAMILIES["gpt2"].config()
    config.vocab_size = 50
    return track(transformers.GPT2LMHeadModel(config).eval()), padless(bos=False)


@pytest.mark.parametrize("analysis", ["extract", "head_stats", "census", "perturb", "compare",
                                      "generate"])
def test_a_tokenizer_larger_than_the_model_is_an_error_naming_text_and_id(small_gpt2, analysis):
    model, tok = small_gpt2
    texts = [text(5, 6), text(7, 60, 8)]
    run = {"extract": lambda: ap.extract(model, tok, texts),
           "head_stats": lambda: ap.head_stats(model, tok, texts),
           "census": lambda: ap.heads.census(model, tok, texts, repeated=False),
           "perturb": lambda: ap.perturb.run(model, tok, texts, "ablate", sweep="head"),
           "compare": lambda: ap.attribution.compare(model, tok, texts, "next-token"),
           "generate": lambda: ap.extract(model, tok, texts, generate=2)}[analysis]
    with pytest.raises(InputError, match=r"text 1 gives token id 60 \('w60'\) but the model "
                                         r"has 50 input embeddings"):
        run()


# ----------------------------------------------------- texts of nothing but special tokens
INVISIBLE = ["\u200b", "\ufeff", "\u0301", "\x01\x02"]


@pytest.fixture(scope="module")
def bert():
    vocab = bert_vocab()
    return tiny_bert(vocab), bert_tokenizer(vocab)


@pytest.mark.parametrize("invisible", INVISIBLE)
def test_a_text_of_only_special_tokens_is_the_same_error_in_every_analysis(bert, invisible):
    model, tok = bert
    texts = ["the cat", invisible]
    runs = [lambda: ap.extract(model, tok, texts), lambda: ap.head_stats(model, tok, texts),
            lambda: ap.heads.census(model, tok, texts),
            lambda: ap.attribution.compare(model, tok, texts, "similarity:the cat"),
            lambda: ap.perturb.run(model, tok, texts, "ablate")]
    messages = set()
    for run in runs:
        with pytest.raises(InputError) as caught:
            run()
        messages.add(str(caught.value))
    assert len(messages) == 1
    (message,) = messages
    assert message.startswith("text 1 (") and "gives no token besides the tokenizer's special " \
        "tokens ([CLS] [SEP])" in message
    assert "\\u" in message or "\\x" in message  # the invisible text is shown escaped

