"""The view registry (a new view is one class), the scope in the views (raw and norm average
the scope's heads; rollout, flow and attention × gradient run through every head), stored maps,
and truncation reaching every view."""

from __future__ import annotations

import pytest
import torch

import attnprobe as ap
from attnprobe.attribution import VIEWS, View, ViewInput, compare, map_importance, views
from attnprobe.errors import InputError
from attnprobe.types import TokenAttribution
from tests import helpers
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert_classifier

VOCAB = bert_vocab("the cat sat on mat a dog ran")
TEXT = "the cat sat on the mat"  # [CLS] + 6 words + [SEP] = 8 tokens
TOY = "test_last_layer_max"


class LastLayerMax(View):
    """A toy view: the max over heads of the last layer's row, computed here from the map."""

    name = TOY

    def importance(self, inp: ViewInput) -> list[TokenAttribution]:
        amap = inp.amap
        scores = amap.pattern[-1].amax(0).double()  # [query, key]
        row = scores[0] if inp.query == "cls" else scores[-1]
        return [inp.result(row, amap.key_tokens, f"{self.name}@L{amap.layers[-1]}")]


@pytest.fixture(scope="module", autouse=True)
def toy_view():
    """One class, registered where it is written: nothing else changes. Removed after this
    module, so elsewhere the registry (and the README generated from it) holds the package's
    views only."""
    VIEWS.register(TOY)(LastLayerMax)
    yield
    VIEWS.unregister(TOY)


@pytest.fixture(scope="module")
def tokenizer():
    return bert_tokenizer(VOCAB)


@pytest.fixture
def model():
    return helpers.tiny_bert(VOCAB, "eager")


def hidden(output, inputs):
    return output.last_hidden_state[:, 0, 0]


# ----------------------------------------------------------------------------- registry
def test_a_registered_view_runs_in_attention_importance_and_compare(model, tokenizer):
    assert TOY in VIEWS and VIEWS.get(TOY) is LastLayerMax
    amap = ap.extract(model, tokenizer, TEXT)[0]
    want = amap.pattern[1].amax(0)[0].double()
    got = views.attention_importance(model, tokenizer, TEXT, views=[TOY, "raw"], scope="layer:1")
    assert [a.method for a in got] == [f"{TOY}@L1", "raw@L1"]
    torch.testing.assert_close(got[0].scores, want, rtol=0, atol=0)
    # a View object works without registering it too
    direct = views.attention_importance(model, tokenizer, TEXT, views=[LastLayerMax()])
    torch.testing.assert_close(direct[0].scores, want, rtol=0, atol=0)

    clf, tok = tiny_bert_classifier("the cat sat on mat a dog ran")
    result = compare(clf, tok, [TEXT], "class:1", views=[TOY, "raw"], methods=["saliency"])
    rows = result.table[result.table.source == f"{TOY}@L1"]
    assert set(rows.metric) == {"kendall_tau", "spearman", "topk_overlap", "jsd"}
    assert set(rows.view) == {TOY} and set(rows.layer) == {1}
    toy = next(a for a in result.attributions if a.method == f"{TOY}@L1")
    clf_map = ap.extract(clf, tok, TEXT)[0]
    torch.testing.assert_close(toy.scores, clf_map.pattern[1].amax(0)[0].double(),
                               rtol=0, atol=0)


def test_unknown_views_and_missing_targets_are_refused_before_any_forward(model, tokenizer):
    with pytest.raises(InputError, match=r"views must be distinct names from \[.*'raw'"):
        views.attention_importance(model, tokenizer, TEXT, views=["raw", "nope"])
    with pytest.raises(InputError, match="'attn_x_grad' needs a target"):
        views.attention_importance(model, tokenizer, TEXT, views=["raw", "attn_x_grad"])
    assert {"raw", "rollout", "flow", "attn_x_grad", "norm"} <= set(VIEWS)
    assert {n for n in VIEWS.names() if VIEWS.get(n).needs_model} >= {"attn_x_grad", "norm"}


# ----------------------------------------------------------------------------- scope
def test_raw_and_norm_average_only_the_scopes_heads(model, tokenizer):
    amap = ap.extract(model, tokenizer, TEXT)[0]
    one = views.attention_importance(model, tokenizer, TEXT, views=["raw", "norm"],
                                     scope="head:1.0")
    assert [a.method for a in one] == ["raw@L1", "norm@L1"]
    # one head: that head's row, exactly
    torch.testing.assert_close(one[0].scores, amap.pattern[1, 0, 0].double(), rtol=0, atol=0)
    norms = views.norm_based(model, tokenizer, TEXT, layer=1)  # [head, query, key]
    torch.testing.assert_close(one[1].scores, norms[0, 0], rtol=0, atol=0)
    # different heads in different layers
    mixed = views.attention_importance(model, tokenizer, TEXT, views=["raw", "norm"],
                                       scope="heads:0.1,1.0", query="last")
    by = {a.method: a.scores for a in mixed}
    torch.testing.assert_close(by["raw@L0"], amap.pattern[0, 1, -1].double(), rtol=0, atol=0)
    torch.testing.assert_close(by["raw@L1"], amap.pattern[1, 0, -1].double(), rtol=0, atol=0)
    norms0 = views.norm_based(model, tokenizer, TEXT, layer=0)
    torch.testing.assert_close(by["norm@L0"], norms0[1, -1], rtol=0, atol=0)
    # every head named one by one is the plain mean
    both = views.attention_importance(model, tokenizer, TEXT, views=["raw", "norm"],
                                      scope="heads:0.0,0.1")
    whole = views.attention_importance(model, tokenizer, TEXT, views=["raw", "norm"],
                                       scope="layer:0")
    for a, b in zip(both, whole, strict=True):
        assert a.method == b.method
        torch.testing.assert_close(a.scores, b.scores, rtol=0, atol=0)
    torch.testing.assert_close(whole[0].scores, amap.pattern[0, :, 0].mean(0).double())
    # the public functions take the same head lists
    torch.testing.assert_close(views.raw(amap, 0, head=[1]), amap.pattern[0, 1, 0].double(),
                               rtol=0, atol=0)
    torch.testing.assert_close(
        views.norm_importance(model, tokenizer, TEXT, layer=0, head=[0, 1]),
        views.norm_importance(model, tokenizer, TEXT, layer=0))
    with pytest.raises(InputError, match=r"head \[2\] out of range \(0\.\.1\)"):
        views.norm_importance(model, tokenizer, TEXT, layer=0, head=[2])
    with pytest.raises(InputError, match=r"heads \[5\] not available"):
        views.raw(amap, 0, head=[0, 5])


def test_rollout_flow_and_attention_x_gradient_use_every_head(model, tokenizer):
    amap = ap.extract(model, tokenizer, TEXT)[0]
    one_head = views.attention_importance(model, tokenizer, TEXT, hidden,
                                          views=["rollout", "flow", "attn_x_grad"],
                                          scope="head:1.0")
    every = views.attention_importance(model, tokenizer, TEXT, hidden,
                                       views=["rollout", "flow", "attn_x_grad"],
                                       scope="layer:1")
    assert [a.method for a in one_head] == ["rollout@L1", "flow@L1", "attn_x_grad"]
    for a, b in zip(one_head, every, strict=True):
        torch.testing.assert_close(a.scores, b.scores, rtol=0, atol=0)
    torch.testing.assert_close(one_head[0].scores, views.rollout(amap)[1, 0], rtol=0, atol=0)
    torch.testing.assert_close(one_head[2].scores,
                               views.attention_x_gradient(model, tokenizer, TEXT, hidden))


# ----------------------------------------------------------------------------- stored maps
def test_map_importance_equals_the_model_run_and_refuses_model_views(model, tokenizer):
    amap = ap.extract(model, tokenizer, TEXT)[0]
    from_map = map_importance(amap, views=["raw", "rollout", "flow"], scope="heads:1.0",
                              query="mean", example_id="m")
    run = views.attention_importance(model, tokenizer, TEXT, views=["raw", "rollout", "flow"],
                                     scope="heads:1.0", query="mean", example_id="m")
    assert [a.method for a in from_map] == [a.method for a in run]
    for a, b in zip(from_map, run, strict=True):
        torch.testing.assert_close(a.scores, b.scores, rtol=0, atol=0)
        assert a.tokens == b.tokens and a.example_id == "m"
    default = {a.method.partition("@")[0] for a in map_importance(amap)}
    assert {"raw", "rollout", "flow", TOY} <= default and "norm" not in default
    for view in ("norm", "attn_x_grad"):
        with pytest.raises(InputError, match=f"view '{view}' runs the model"):
            map_importance(amap, views=["raw", view])
    with pytest.raises(InputError, match="AttentionMap"):
        map_importance("map.npz")


# ----------------------------------------------------------------------------- truncation
def test_truncation_reaches_every_view(model, tokenizer):
    words = ("the cat sat on a mat dog ran " * 10).split()  # 80 words: 82 tokens > 64
    long_text = " ".join(words)
    cut_text = " ".join(words[:62])  # what cutting to 64 tokens keeps ([CLS] .. [SEP])
    all_views = ["raw", "rollout", "flow", "attn_x_grad", "norm"]
    for view in all_views:
        with pytest.raises(InputError, match="82 tokens but the model takes at most 64"):
            views.attention_importance(model, tokenizer, long_text, hidden, views=[view])
    cut = views.attention_importance(model, tokenizer, long_text, hidden, views=all_views,
                                     scope="layer:1", truncation="cut")
    fits = views.attention_importance(model, tokenizer, cut_text, hidden, views=all_views,
                                      scope="layer:1")
    assert [a.method for a in cut] == ["raw@L1", "rollout@L1", "flow@L1", "attn_x_grad",
                                       "norm@L1"]
    for a, b in zip(cut, fits, strict=True):
        assert len(a.tokens) == 64 and a.tokens == b.tokens
        torch.testing.assert_close(a.scores, b.scores)
    short = views.attention_importance(model, tokenizer, TEXT, hidden, views=all_views,
                                       max_length=5, truncation="cut")
    assert {a.tokens for a in short} == {("[CLS]", "the", "cat", "sat", "[SEP]")}
    row = views.norm_importance(model, tokenizer, long_text, layer=1, truncation="cut")
    torch.testing.assert_close(row, next(a for a in fits if a.method == "norm@L1").scores)
