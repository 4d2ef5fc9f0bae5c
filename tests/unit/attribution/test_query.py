"""Which query row the views read: ``query="auto"`` follows the model's kind (the last real
token of a causal model, ``[CLS]`` / the first token otherwise), from the model, from a
stored map's ``info.causal``, or from the map itself."""

from __future__ import annotations

import pytest
import torch

import attnprobe as ap
from attnprobe.attribution import views
from attnprobe.attribution.attention_flow import flow
from attnprobe.attribution.comparison import compare
from attnprobe.attribution.model_views import attention_x_gradient
from attnprobe.attribution.targets import parse_target
from attnprobe.attribution.view_base import ViewInput
from attnprobe.attribution.view_common import map_causal, prefix_map, resolve_query
from attnprobe.capture.info import causal_of
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError
from attnprobe.types import AttentionMap, ModelInfo
from tests.conftest import track

TEXT = "the cat sat on the mat"


def _map(pattern: torch.Tensor, causal: bool | None) -> AttentionMap:
    n = pattern.shape[-1]
    tokens = tuple(f"t{i}" for i in range(n))
    info = ModelInfo("toy", "toy", pattern.shape[0], pattern.shape[1], causal)
    return AttentionMap(pattern, tokens, tokens, tuple(range(pattern.shape[0])), info)


def _causal_pattern(n: int = 5) -> torch.Tensor:
    scores = torch.randn(2, 2, n, n).masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
    return scores.softmax(-1)


def test_resolve_query():
    assert resolve_query("auto", True) == "last"
    assert resolve_query("auto", False) == "cls" and resolve_query("auto", None) == "cls"
    assert resolve_query("max", True) == "max" and resolve_query(-2, False) == -2
    with pytest.raises(InputError, match=r"query must be one of \['auto', 'cls'"):
        resolve_query("middle", True)


def test_map_causal_from_info_then_from_the_weights():
    causal, full = _causal_pattern(), torch.softmax(torch.randn(2, 2, 5, 5), -1)
    assert map_causal(_map(causal, True)) and not map_causal(_map(full, False))
    assert map_causal(_map(causal, None)) is True  # no later key carries weight
    assert map_causal(_map(full, None)) is False
    assert map_causal(_map(full, True)) is True  # the model's flag wins


@pytest.mark.parametrize("causal", [True, None])
def test_map_views_read_the_last_row_of_a_causal_map(causal):
    pattern = _causal_pattern()
    amap = _map(pattern, causal)
    mean = pattern[1].mean(0).double()
    assert torch.allclose(views.raw(amap, 1), mean[-1])
    assert torch.allclose(views.raw(amap, 1, query="cls"), mean[0])
    joint = views.rollout(amap)
    found = {a.method: a.scores for a in views.map_importance(amap, views=["raw", "rollout"])}
    assert torch.allclose(found["rollout@L1"], joint[1, -1])
    assert torch.allclose(flow(amap, layer=0), joint[0, -1], atol=1e-8)  # flow = rollout at L0


def test_map_views_read_the_first_row_of_a_bidirectional_map():
    pattern = torch.softmax(torch.randn(2, 2, 5, 5), -1)
    amap = _map(pattern, False)
    assert torch.allclose(views.raw(amap, 0), pattern[0].mean(0).double()[0])


def test_model_kind_sets_the_row_of_the_model_views():
    causal, causal_tok = ap.load_model("ref:transformer")
    encoder, enc_tok = ap.load_model("ref:encoder")
    track(causal), track(encoder)
    assert causal_of(causal) is True and causal_of(encoder) is False
    assert ViewInput(TEXT, Scope(), model=causal, tokenizer=causal_tok).query == "last"
    assert ViewInput(TEXT, Scope(), model=encoder, tokenizer=enc_tok).query == "cls"
    target = parse_target("next-token:5", causal, causal_tok)
    assert torch.equal(attention_x_gradient(causal, causal_tok, TEXT, target),
                       attention_x_gradient(causal, causal_tok, TEXT, target, query="last"))


def test_causal_of_a_transformers_model():
    from tests.integration.causal_lms import causal_lm
    from tests.integration.hf_models import build

    assert causal_of(causal_lm("llama")[0]) is True
    assert causal_of(build("bert")) is False
    assert causal_of(build("bart")) is False  # the encoder's, which views read
    assert causal_of(torch.nn.Linear(2, 2)) is None


@pytest.mark.parametrize(("name", "row"), [("ref:transformer", "last"), ("ref:encoder", "cls")])
def test_compare_defaults_to_the_row_of_the_model_kind(name, row):
    model, tok = ap.load_model(name)
    track(model)
    texts = ["the cat sat on the mat", "a dog ran"]
    options = dict(methods=["saliency"], views=["raw", "rollout"])
    target = "next-token" if row == "last" else "similarity:a cat"
    auto = compare(model, tok, texts, target, **options)
    explicit = compare(model, tok, texts, target, query=row, **options)
    assert auto.table.value.equals(explicit.table.value)
    if row == "last":  # the failure: a causal model's first row sees only itself
        with pytest.raises(InputError, match="raw@L0 is constant"):
            compare(model, tok, texts, target, query="cls", **options)
    else:
        other = compare(model, tok, texts, target, query="last", **options)
        assert not auto.table.value.equals(other.table.value)


def test_prefix_map_is_the_map_of_the_first_tokens():
    model, tok = ap.load_model("ref:induction")
    whole = ap.extract(model, tok, ["t01 t02 t03 t04 t05 t06"])[0]
    head = ap.extract(model, tok, ["t01 t02 t03"])[0]
    cut = prefix_map(whole, 4)
    assert cut.query_tokens == head.query_tokens
    assert (cut.pattern - head.pattern).abs().max() <= 1e-6
    encoder, enc_tok = ap.load_model("ref:encoder")
    both_ways = ap.extract(encoder, enc_tok, [TEXT])[0]
    with pytest.raises(InputError, match="rows must sum to 1"):
        prefix_map(both_ways, 3)
    with pytest.raises(InputError, match=r"prefix length must be an int in 1\.\.7"):
        prefix_map(whole, 0)


def test_the_default_views_leave_out_norm_where_the_model_cannot_serve_it():
    """ref:induction is attnprobe's own LLaMA: norm cannot slice its output projection, so
    the defaults compare without it, while asking for norm by name stays an error."""
    model, tok = ap.load_model("ref:induction")
    prompt = "t05 t11 t40 t03 t17 t42 t08 t55 t21 t03 t17"
    table = ap.attribution.compare(model, tok, [prompt], "next-token",
                                   methods=["saliency"]).table
    views = {m.split("@")[0] for m in table["view"].unique()} if "view" in table else set()
    assert views and "norm" not in views and {"raw", "rollout"} <= views
    with pytest.raises(InputError, match="norm-based importance"):
        ap.attribution.compare(model, tok, [prompt], "next-token", views=["norm"])
