"""The baseline token of Integrated Gradients (and occlusion's filler) by one documented rule
(issue 24, item 7): the pad token, else unk, else mask, else eos, else the first ordinary
token. A LLaMA-3-style tokenizer (byte-level BPE, no pad, no unk) works as it ships, in
``attribute`` and in ``perturb erase``; the token chosen is named in a warning."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

import attnprobe as ap
from attnprobe.attribution.baseline import baseline_token
from attnprobe.attribution.methods import attribute
from attnprobe.core.tokens import byte_alphabet
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
TEXT = "the cat sat on the mat"


def llama3_tokenizer(**extra: str) -> transformers.PreTrainedTokenizerFast:
    """Byte-level BPE as LLaMA 3 ships it: every byte a token, ``<|begin_of_text|>`` first,
    ``<|end_of_text|>`` as eos, no pad and no unk token (``extra`` adds role tokens)."""
    vocab = {ch: i for i, ch in enumerate(sorted(byte_alphabet(), key=byte_alphabet().get))}
    vocab.update({BOS: len(vocab), EOS: len(vocab) + 1})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, vocab[BOS])])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS,
                                                eos_token=EOS, **extra)


@pytest.fixture(scope="module")
def llama3():
    tok = llama3_tokenizer()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, initializer_range=0.3)
    return track(transformers.LlamaForCausalLM(config).eval()), tok


def test_the_rule_takes_the_first_role_the_tokenizer_has():
    bert = bert_tokenizer(bert_vocab())
    assert baseline_token(bert).id == bert.pad_token_id and baseline_token(bert).source == "pad"
    tok = llama3_tokenizer()
    assert tok.pad_token_id is None and tok.unk_token_id is None
    found = baseline_token(tok)
    assert (found.id, found.source, found.token) == (tok.eos_token_id, "eos", EOS)
    masked = llama3_tokenizer(mask_token=EOS)
    assert baseline_token(masked).source == "mask"
    # no role token at all: the first ordinary token, by id (the byte 0x00, id 0 here)
    bare = llama3_tokenizer()
    bare.eos_token = None
    found = baseline_token(bare)
    assert (found.id, found.source) == (0, "first ordinary token")
    assert baseline_token(bare, vocab=0) is None  # nothing fits an empty embedding


def test_integrated_gradients_on_a_tokenizer_without_pad_or_unk(llama3):
    model, tok = llama3
    with pytest.warns(UserWarning, match=f"baseline token is the eos token '{EOS}'"):
        (found,) = attribute(model, tok, [TEXT], "next-token",
                             methods=["integrated_gradients"], n_steps=8)
    # the same run with the eos set as pad by hand (the usual workaround) gives the same scores
    padded = llama3_tokenizer(pad_token=EOS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pad token: nothing to warn about
        (manual,) = attribute(model, padded, [TEXT], "next-token",
                              methods=["integrated_gradients"], n_steps=8)
    torch.testing.assert_close(found.scores, manual.scores)
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    baseline = torch.full_like(ids, tok.eos_token_id)
    baseline[0, 0] = tok.bos_token_id  # special tokens stay
    with torch.no_grad():
        top = int(model(ids).logits[0, -1].argmax())
        gap = (model(ids).logits[0, -1, top] - model(baseline).logits[0, -1, top]).item()
    # completeness against the baseline built by hand: Σ scores = f(x) - f(baseline) - error
    assert abs(float(found.scores.sum()) - gap) <= found.delta + 1e-5 * max(1.0, abs(gap))


def test_occlusion_fills_with_the_baseline_token(llama3):
    model, tok = llama3
    with pytest.warns(UserWarning, match="baseline token is the eos token"):
        (found,) = attribute(model, tok, [TEXT], "next-token", methods=["occlusion"])
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        top = int(model(ids).logits[0, -1].argmax())
        full = model(ids).logits[0, -1, top]
        i = 3  # one position, occluded by hand
        occluded = ids.clone()
        occluded[0, i] = tok.eos_token_id
        expected = (full - model(occluded).logits[0, -1, top]).item()
    assert found.scores[i].item() == pytest.approx(expected, abs=1e-5 * max(1.0, abs(expected)))


def test_perturb_erase_ranks_by_integrated_gradients(llama3):
    model, tok = llama3
    with pytest.warns(UserWarning, match="baseline token is the eos token"):
        table = ap.perturb.run(model, tok, [TEXT], "erase", max_erased=2, n_steps=4,
                               rankings=("integrated_gradients",))
    assert set(table["ranking"]) == {"integrated_gradients"} and len(table) > 0
