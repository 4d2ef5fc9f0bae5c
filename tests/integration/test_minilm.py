"""The packaged all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads, SDPA by default), loaded offline.

Expected weights come from the same model loaded with ``attn_implementation="eager"`` and
``output_attentions=True`` (transformers' own eager path), never from attnprobe.
"""

from __future__ import annotations

import pytest
import torch

import attnprobe
from attnprobe import InputError
from attnprobe.inputs.text import encode
from tests.conftest import track

TOL = 1e-5
N_LAYERS, N_HEADS, MAX_LEN = 6, 12, 512
TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank.",
         "Attention is all you need."]


@pytest.fixture(scope="module")
def minilm():
    model, tok = attnprobe.load_model("minilm")
    assert model.config._attn_implementation == "sdpa"
    return track(model), tok  # tracked: the autouse guard checks it after every test


@pytest.fixture(scope="module")
def minilm_eager():
    # Not tracked for hooks: transformers 5 installs its own permanent output-capturing hooks
    # on the first output_attentions=True call. attnprobe never touches this model.
    model, _ = attnprobe.load_model("minilm", attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    return model


def _batch(tok, texts, side="right"):
    old = tok.padding_side
    tok.padding_side = side
    try:
        batch = tok(texts, padding=True, return_tensors="pt")
    finally:
        tok.padding_side = old
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def _eager_maps(eager, batch):
    """Per example ``[layer, head, q, k]`` eager weights on real tokens."""
    with torch.no_grad():
        out = eager(**batch, output_attentions=True)
    assert len(out.attentions) == N_LAYERS
    mask = batch["attention_mask"].bool()
    return [torch.stack([a[b] for a in out.attentions])[:, :, mask[b]][..., mask[b]]
            for b in range(mask.shape[0])]


def test_captured_sdpa_outputs_equal_uncaptured(minilm):
    model, tok = minilm
    batch = _batch(tok, TEXTS)
    assert not batch["attention_mask"].all()  # really padded
    with torch.no_grad():
        ref = model(**batch)
    with torch.no_grad(), attnprobe.capture(model, tokenizer=tok) as cap:
        out = model(**batch)
    mask = batch["attention_mask"].bool()
    assert (out.last_hidden_state - ref.last_hidden_state)[mask].abs().max().item() <= TOL
    assert (out.pooler_output - ref.pooler_output).abs().max().item() <= TOL
    assert len(cap.maps) == len(TEXTS)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("side", ["right", "left"])
def test_captured_weights_equal_eager(minilm, minilm_eager, side):
    model, tok = minilm
    batch = _batch(tok, TEXTS, side)
    with torch.no_grad(), attnprobe.capture(model, tokenizer=tok) as cap:
        model(**batch)
    expected = _eager_maps(minilm_eager, batch)
    assert len(cap.maps) == len(expected)
    for amap, want in zip(cap.maps, expected, strict=True):
        assert amap.shape == tuple(want.shape)
        assert (amap.pattern - want).abs().max().item() <= TOL
        assert amap.layers == tuple(range(N_LAYERS))
        assert amap.heads == tuple(range(N_HEADS))
        assert amap.stack == "encoder.layer"
        assert amap.kind == "self"


def test_extract_two_sentences(minilm, minilm_eager):
    model, tok = minilm
    maps = attnprobe.extract(model, tok, TEXTS)
    assert len(maps) == 2
    assert [m.example_id for m in maps] == ["0", "1"]
    for text, amap in zip(TEXTS, maps, strict=True):
        n = len(tok(text)["input_ids"])
        assert amap.shape == (N_LAYERS, N_HEADS, n, n)
        assert amap.query_tokens[0] == "[CLS]" and amap.query_tokens[-1] == "[SEP]"
        assert amap.key_tokens == amap.query_tokens
        assert (amap.pattern.sum(-1) - 1).abs().max().item() <= 1e-5
        # each text alone (no padding) through transformers' eager path
        (want,) = _eager_maps(minilm_eager, _batch(tok, [text]))
        assert (amap.pattern - want).abs().max().item() <= TOL
    assert model.config._attn_implementation == "sdpa"


def test_extract_layer_and_head_selection(minilm, minilm_eager):
    model, tok = minilm
    (amap,) = attnprobe.extract(model, tok, TEXTS[:1], scope="heads:5.0,5.11")
    (want,) = _eager_maps(minilm_eager, _batch(tok, TEXTS[:1]))
    assert amap.layers == (5,) and amap.heads == (0, 11)
    assert (amap.pattern - want[5:6, [0, 11]]).abs().max().item() <= TOL
    # heads of different layers: the smallest grid that holds them
    (grid,) = attnprobe.extract(model, tok, TEXTS[:1], scope=["head:1.3", "head:4.7"])
    assert grid.layers == (1, 4) and grid.heads == (3, 7)
    assert (grid.pattern - want[[1, 4]][:, [3, 7]]).abs().max().item() <= TOL


def test_left_and_right_padding_equal_with_position_ids(minilm):
    """Through ``capture`` with position ids from the mask, the padding side does not matter."""
    model, tok = minilm
    maps = {}
    for side in ("left", "right"):
        batch = _batch(tok, TEXTS, side)
        batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad(), attnprobe.capture(model, tokenizer=tok) as cap:
            model(**batch)
        maps[side] = cap.maps
    for left, right in zip(maps["left"], maps["right"], strict=True):
        assert left.query_tokens == right.query_tokens
        assert (left.pattern - right.pattern).abs().max().item() <= TOL


def test_extract_maps_do_not_depend_on_the_batch(minilm):
    model, tok = minilm
    batched = attnprobe.extract(model, tok, TEXTS)
    for text, together in zip(TEXTS, batched, strict=True):
        (alone,) = attnprobe.extract(model, tok, [text])
        assert alone.query_tokens == together.query_tokens
        assert (alone.pattern - together.pattern).abs().max().item() <= TOL


def test_too_long_text_needs_truncation(minilm):
    model, tok = minilm
    text = " ".join(["word"] * (MAX_LEN + 100))
    with pytest.raises(InputError, match="truncation='cut'"):
        attnprobe.extract(model, tok, text, scope="layer:0")
    (amap,) = attnprobe.extract(model, tok, text, scope="head:0.0", truncation="cut")
    assert amap.shape == (1, 1, MAX_LEN, MAX_LEN)
    assert len(amap.query_tokens) == len(amap.key_tokens) == MAX_LEN
    assert amap.query_tokens[0] == "[CLS]" and amap.query_tokens[-1] == "[SEP]"
    assert model.config._attn_implementation == "sdpa"
    assert attnprobe.extract(model, tok, text, truncation=True)[0].shape[2] == MAX_LEN
    kept = attnprobe.extract(model, tok, [text, TEXTS[0]], truncation="skip", scope="layer:0")
    assert [m.example_id for m in kept] == ["1"]
    with pytest.raises(InputError, match="every text is longer"):
        attnprobe.extract(model, tok, [text], truncation="skip")


def test_truncation_keeps_other_texts_whole(minilm):
    model, tok = minilm
    long_text = " ".join(["word"] * (MAX_LEN + 10))
    batch = encode(model, tok, [long_text, TEXTS[1]], truncation=True, padding_side="left")
    assert batch["input_ids"].shape == (2, MAX_LEN)
    assert int(batch["attention_mask"][1].sum()) == len(tok(TEXTS[1])["input_ids"])


@pytest.mark.parametrize("texts", ["", "   ", ["fine text", ""], []])
def test_empty_text_raises(minilm, texts):
    model, tok = minilm
    with pytest.raises(InputError):
        attnprobe.extract(model, tok, texts)
