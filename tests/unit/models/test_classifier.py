"""Attention classifiers (Jain & Wallace BiLSTM / average + tanh attention, Transformer):
the formula, padding, [BOS] masking, hooks, capture, the zoo entries and input errors."""

from __future__ import annotations

import pytest
import torch

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.models import build_reference
from attnprobe.models.classifier import (
    AttentionClassifier,
    AttentionClassifierConfig,
    TransformerClassifier,
    TransformerClassifierConfig,
    keytoken_tokenizer,
)
from attnprobe.tasks.keytoken import WORDS
from tests.conftest import track

NAMES = ("bilstm-classifier", "average-classifier", "transformer-classifier")
TEXTS = ["key cat the red sun", "dog", "a big tree key"]


def test_zoo_builders_are_seeded_and_use_the_keytoken_vocabulary():
    for name in NAMES:
        model, tok = build_reference(name, seed=3)
        again, _ = build_reference(name, seed=3)
        other, _ = build_reference(name, seed=4)
        assert model.attnprobe_name == name and not model.training
        pairs = list(zip(model.parameters(), again.parameters(), strict=True))
        assert all(torch.equal(a, b) for a, b in pairs)
        assert any(not torch.equal(a, b)
                   for a, b in zip(model.parameters(), other.parameters(), strict=True))
        assert tok.unk_token_id not in tok.convert_tokens_to_ids(list(WORDS))
        assert len(tok) == len(keytoken_tokenizer())


@pytest.mark.parametrize("name", NAMES)
def test_padding_side_does_not_change_logits(name):
    model, tok = build_reference(name)
    with torch.no_grad():
        alone = torch.cat([model(**tok([t])) for t in TEXTS])
        for side in ("left", "right"):
            logits = model(**tok(TEXTS, padding_side=side))
            assert logits.shape == (3, 2)
            assert torch.allclose(logits, alone, atol=1e-5)


def test_additive_attention_matches_the_formula_and_skips_bos():
    model, tok = build_reference("average-classifier")
    batch = tok(["key cat the"])
    with torch.no_grad():
        e = model.embed(batch["input_ids"])[0]  # [4, d_embed]
        h = torch.tanh(model.projection(e))  # the "average" encoder: per token
        a = model.attention.score
        scores = a.v_a(torch.tanh(a.W_a(model.query) + a.U_a(h))).squeeze(-1)  # [4]
        weights = torch.softmax(scores[1:], dim=0)  # [BOS] excluded (J&W mask <SOS>)
        logits = model.classifier(weights @ h[1:])
        assert torch.allclose(model(**batch)[0], logits, atol=1e-6)


def test_bilstm_states_skip_padding_on_either_side():
    model, tok = build_reference("bilstm-classifier")
    ids = torch.tensor(tok.encode("key cat the red"))[None]
    embedded = model.embed(ids)
    with torch.no_grad():
        plain, _ = model.lstm(embedded)  # no padding at all
        for side in ("left", "right"):
            batch = tok(["key cat the red", "dog"], padding_side=side)
            states = model.encode(model.embed(batch["input_ids"]), batch["attention_mask"].bool())
            assert torch.allclose(states[0], plain[0], atol=1e-6)
            short = batch["attention_mask"][1].bool()
            alone, _ = model.lstm(model.embed(torch.tensor(tok.encode("dog"))[None]))
            assert torch.allclose(states[1][short], alone[0], atol=1e-6)
            assert torch.all(states[1][~short] == 0)


@pytest.mark.parametrize("name", NAMES)
def test_capture_gives_padding_stripped_rows_that_sum_to_one(name):
    model, tok = build_reference(name)
    model = track(model)
    batch = tok(TEXTS, padding_side="left")
    with torch.no_grad(), ap.capture(model, tokenizer=tok, scores=True) as cap:
        model(**batch)
    assert len(cap.maps) == len(TEXTS)
    for amap, text in zip(cap.maps, TEXTS, strict=True):
        n = len(text.split()) + 1
        assert amap.key_tokens == ("[BOS]", *text.split())
        assert torch.allclose(amap.pattern.sum(-1), torch.ones(()), atol=1e-5)
        if name == "transformer-classifier":
            assert amap.shape == (2, 2, n, n)
        else:
            assert amap.shape == (1, 1, 1, n)  # one layer, one head, one (learned) query
            assert amap.query_tokens == ("[query 0]",)
            assert float(amap.pattern[0, 0, 0, 0]) == 0.0  # [BOS] is not attended


def test_an_edit_of_the_pattern_reaches_the_logits():
    model, tok = build_reference("bilstm-classifier")
    model = track(model)
    batch = tok(["key cat the red sun"])
    with torch.no_grad():
        plain = model(**batch)

        def onto_last(layer, pattern):
            edited = torch.zeros_like(pattern)
            edited[..., -1] = 1.0
            return edited

        with ap.capture(model, edit=onto_last) as cap:
            edited = model(**batch)
    assert cap.maps[0].pattern[0, 0, 0].tolist() == [0, 0, 0, 0, 0, 1]
    assert not torch.allclose(plain, edited)


def test_attend_bos_keeps_the_bos_weight():
    cfg = AttentionClassifierConfig(vocab_size=len(keytoken_tokenizer()), encoder="average",
                                    attend_bos=True)
    model, tok = track(AttentionClassifier(cfg)), keytoken_tokenizer()
    with ap.capture(model) as cap:
        model(**tok(["key cat"]))
    assert float(cap.maps[0].pattern[0, 0, 0, 0]) > 0


def test_transformer_mean_pooling_and_bos_pooling_differ():
    tok = keytoken_tokenizer()
    torch.manual_seed(0)
    bos = TransformerClassifier(TransformerClassifierConfig(vocab_size=len(tok)))
    mean = TransformerClassifier(TransformerClassifierConfig(vocab_size=len(tok), pooling="mean"))
    mean.load_state_dict(bos.state_dict())
    batch = tok(TEXTS, padding_side="left")
    with torch.no_grad():
        assert not torch.allclose(bos(**batch), mean(**batch))
        alone = torch.cat([mean(**tok([t])) for t in TEXTS])
        assert torch.allclose(mean(**batch), alone, atol=1e-5)


def test_bad_inputs_and_configs_are_input_errors():
    model, _ = build_reference("bilstm-classifier")
    with pytest.raises(InputError, match="no word besides"):
        model(input_ids=torch.tensor([[2, 5], [2, 0]]),
              attention_mask=torch.tensor([[1, 1], [1, 0]]))
    with pytest.raises(InputError, match="must lie in"):
        model(input_ids=torch.tensor([[2, 10_000]]))
    with pytest.raises(InputError, match="encoder"):
        AttentionClassifierConfig(vocab_size=10, encoder="cnn")
    with pytest.raises(InputError, match="pooling"):
        TransformerClassifierConfig(vocab_size=10, pooling="max")
    with pytest.raises(InputError, match="causal"):
        TransformerClassifierConfig(vocab_size=10, causal=True)
    transformer, _ = build_reference("transformer-classifier")
    with pytest.raises(InputError, match="max_len"):
        transformer(input_ids=torch.full((1, 65), 5))
