"""attention_head and model_view draw exactly the weights of the map, with the tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.plot import attention_head, model_view
from attnprobe.types import AttentionMap, ModelInfo
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert
from tests.unit.plot.drawn import image, mesh, render, ticks

TOKENS = ("[CLS]", "$x$", "cat", "<b>", "[SEP]")


@pytest.fixture
def amap() -> AttentionMap:
    generator = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 3, 5, 5, generator=generator)
    info = ModelInfo("hand", "hand", n_layers=4, n_heads=3, causal=False)
    return AttentionMap(torch.softmax(scores, -1), TOKENS, TOKENS, layers=(1, 3), info=info,
                        example_id="s0")


def test_one_head_draws_its_weights_with_every_token_as_plain_text(amap):
    fig = attention_head(amap, 3, 2)
    ax = fig.axes[0]
    render(fig)
    np.testing.assert_allclose(mesh(ax), amap.head(3, 2).numpy(), rtol=1e-6)
    assert ticks(ax, "x") == list(TOKENS) and ticks(ax, "y") == list(TOKENS)
    assert not any(t.get_parse_math() for t in ax.get_xticklabels())  # "$x$" stays text
    assert ax.get_title() == "L3H2 · example s0"
    assert "weight" in fig.axes[1].get_ylabel()  # the colour bar


def test_the_tidy_table_draws_the_same_as_the_map(amap):
    from_map = mesh(attention_head(amap, 1, 0).axes[0])
    from_table = mesh(attention_head(amap.to_frame(), 1, 0).axes[0])
    np.testing.assert_allclose(from_table, from_map, rtol=1e-6)


def test_given_axes_are_drawn_into_and_returned(amap):
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.subplots()
    assert attention_head(amap, 1, 1, ax=ax, annotate=True) is ax
    assert len(ax.texts) == 25  # one weight per cell


def test_model_view_has_one_thumbnail_per_head_with_its_weights(amap):
    fig = model_view(amap)
    render(fig)
    thumbs = [ax for ax in fig.axes if ax.get_images()]
    assert len(thumbs) == 2 * 3
    for ax in thumbs:
        layer, head = (int(v) for v in ax.get_gid()[1:].split("H"))
        np.testing.assert_allclose(image(ax), amap.head(layer, head).numpy(), rtol=1e-6)
    assert [ax.get_title() for ax in thumbs[:3]] == ["H0", "H1", "H2"]
    assert [thumbs[0].get_ylabel(), thumbs[3].get_ylabel()] == ["L1", "L3"]


def test_model_view_scope_picks_heads(amap):
    fig = model_view(amap, scope="heads:1.0,3.2")
    drawn = sorted(ax.get_gid() for ax in fig.axes if ax.get_images())
    assert drawn == ["L1H0", "L3H2"]
    assert len([ax for ax in fig.axes if ax.get_gid() is None and not ax.get_images()]) >= 2


def test_model_view_of_a_real_capture_covers_every_layer_and_head():
    vocab = bert_vocab()
    model, tok = tiny_bert(vocab), bert_tokenizer(vocab)
    amap = ap.extract(model, tok, ["the cat sat on a mat"])[0]
    fig = model_view(amap)
    render(fig, "svg")
    assert len([ax for ax in fig.axes if ax.get_images()]) == 2 * 2
    assert ticks(attention_head(amap, 1, 1).axes[0]) == list(amap.key_tokens)


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: attention_head(m, 0, 0), r"no head L0H0"),
    (lambda m: attention_head(m, 1, 7), r"no head L1H7"),
    (lambda m: attention_head([m], 1, 0), r"pass one AttentionMap"),
    (lambda m: attention_head("map", 1, 0), r"expected an AttentionMap"),
    (lambda m: attention_head(m.to_frame().iloc[:0], 1, 0), r"empty"),
    (lambda m: attention_head(m.to_frame().drop(columns="weight"), 1, 0), r"lacks column"),
    (lambda m: model_view(m, scope="layer:0"), r"selects no head"),
])
def test_bad_input_is_a_one_line_error(amap, call, message):
    with pytest.raises(InputError, match=message) as caught:
        call(amap)
    assert "\n" not in str(caught.value)


def test_a_table_of_several_examples_needs_an_example_id(amap):
    import pandas as pd

    other = AttentionMap(amap.pattern.flip(-1).softmax(-1), TOKENS, TOKENS, amap.layers,
                         amap.info, example_id="s1")
    table = pd.concat([amap.to_frame(), other.to_frame()])
    with pytest.raises(InputError, match="pass example_id"):
        attention_head(table, 1, 0)
    drawn = mesh(attention_head(table, 1, 0, example_id="s1").axes[0])
    np.testing.assert_allclose(drawn, other.head(1, 0).numpy(), rtol=1e-6)
