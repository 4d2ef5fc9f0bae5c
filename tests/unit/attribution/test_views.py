"""Attention views: raw rows, rollout by construction (methods §13 self-test 6), attention ×
gradient and norm-based importance against hand computations on tiny models."""

from __future__ import annotations

import pytest
import torch
import transformers

import attnprobe as ap
from attnprobe.attribution import model_views, views
from attnprobe.errors import InputError
from attnprobe.types import AttentionMap, ModelInfo
from tests import helpers
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab

VOCAB = bert_vocab("the cat sat on mat a dog ran")
TEXT = "the cat sat on the mat"  # [CLS] + 6 words + [SEP] = 8 tokens


def make_map(pattern: torch.Tensor, kind: str = "self") -> AttentionMap:
    n_layers, n_heads, n, _ = pattern.shape
    tokens = tuple(f"t{i}" for i in range(n))
    return AttentionMap(pattern, tokens, tokens, tuple(range(n_layers)),
                        ModelInfo("test", "test", n_layers, n_heads, False), kind=kind)


@pytest.fixture(scope="module")
def tokenizer():
    return bert_tokenizer(VOCAB)


def tiny_bert(implementation: str = "sdpa") -> transformers.BertModel:
    return helpers.tiny_bert(VOCAB, implementation)


def first_token(output, inputs):
    return output.last_hidden_state[:, 0, 0]


class Named:
    """A target with a name, as ``attnprobe.attribution.targets`` builds them."""

    spec = "hidden:0"

    def __call__(self, output, inputs):
        return first_token(output, inputs)


# ----------------------------------------------------------------------------- raw
def test_raw_reads_rows_and_heads():
    p = torch.softmax(torch.randn(2, 3, 4, 4), -1)
    amap = make_map(p)
    mean = p[1].mean(0).double()
    assert torch.allclose(views.raw(amap, 1), mean[0])
    assert torch.allclose(views.raw(amap, 1, query="first"), mean[0])
    assert torch.allclose(views.raw(amap, 1, query="last"), mean[-1])
    assert torch.allclose(views.raw(amap, 1, query=-2), mean[2])
    assert torch.allclose(views.raw(amap, 1, query="mean"), mean.mean(0))
    assert torch.allclose(views.raw(amap, 1, query="max"), mean.amax(0))
    assert torch.allclose(views.raw(amap, 0, head=2, query=1), p[0, 2, 1].double())
    assert views.raw(amap, 0).dtype == torch.float64
    for bad in ("middle", 4, 1.0, True):
        with pytest.raises(InputError, match="query"):
            views.raw(amap, 0, query=bad)
    with pytest.raises(InputError, match="layer 2"):
        views.raw(amap, 2)


# ----------------------------------------------------------------------------- rollout
@pytest.mark.parametrize("residual", [True, False])
def test_rollout_of_identity_is_identity(residual):
    amap = make_map(torch.eye(5).expand(3, 2, 5, 5).clone())
    out = views.rollout(amap, residual=residual)
    assert out.shape == (3, 5, 5)
    assert torch.allclose(out, torch.eye(5, dtype=torch.float64).expand(3, 5, 5))


def test_rollout_of_uniform_attention_converges_to_uniform():
    n, depth = 6, 30
    amap = make_map(torch.full((depth, 2, n, n), 1.0 / n))
    eye = torch.eye(n, dtype=torch.float64)
    uniform = torch.full((n, n), 1.0 / n, dtype=torch.float64)
    out = views.rollout(amap)
    assert torch.allclose(out[0], 0.5 * uniform + 0.5 * eye)  # each layer: 0.5U + 0.5I
    for layer in (1, 4):  # (0.5U + 0.5I)^(l+1) = U + 0.5^(l+1) (I - U)
        assert torch.allclose(out[layer], uniform + 0.5 ** (layer + 1) * (eye - uniform))
    assert torch.allclose(out[-1], uniform, atol=1e-8)
    assert torch.allclose(out.sum(-1), torch.ones(depth, n, dtype=torch.float64))


def test_rollout_is_the_product_of_augmented_head_means():
    p = torch.softmax(2 * torch.randn(3, 2, 4, 4), -1).double()
    amap = make_map(p.float())
    eye = torch.eye(4, dtype=torch.float64)
    a = [0.5 * p[i].mean(0) + 0.5 * eye for i in range(3)]
    assert torch.allclose(views.rollout(amap)[2], a[2] @ a[1] @ a[0], atol=1e-6)
    plain = [p[i].mean(0) for i in range(3)]
    assert torch.allclose(views.rollout(amap, residual=False)[2],
                          plain[2] @ plain[1] @ plain[0], atol=1e-6)
    top = p[0].amax(0)
    assert torch.allclose(views.rollout(amap, residual=False, head_reduce="max")[0],
                          top / top.sum(-1, keepdim=True), atol=1e-6)


def test_rollout_refuses_bad_maps():
    disjoint = torch.zeros(1, 2, 2, 2)
    disjoint[0, 0, :, 0] = 1
    disjoint[0, 1, :, 1] = 1
    with pytest.raises(InputError, match="no weight"):
        views.rollout(make_map(disjoint), head_reduce="min")
    with pytest.raises(InputError, match="head_reduce"):
        views.rollout(make_map(disjoint), head_reduce="median")
    amap = make_map(torch.full((3, 1, 2, 2), 0.5))
    with pytest.raises(InputError, match=r"every layer from 0.*\[0, 2\]"):
        views.rollout(amap.select(layers=[0, 2]))
    with pytest.raises(InputError, match="self-attention"):
        views.rollout(make_map(torch.full((1, 1, 2, 2), 0.5), kind="cross"))


# ----------------------------------------------------------------------------- attn × grad
def test_attention_x_gradient_matches_a_hand_computation_and_removes_hooks(tokenizer):
    model = tiny_bert("eager")
    got = views.attention_x_gradient(model, tokenizer, TEXT, first_token)
    assert got.shape == (8,) and torch.isfinite(got).all() and got[0] >= 1
    assert ap.count_hooks(model) == 0
    # by hand: the eager model's own returned weights are the ones used in the forward
    inputs = tokenizer([TEXT], return_tensors="pt")
    out = model(**inputs, output_attentions=True)
    grads = torch.autograd.grad(first_token(out, inputs).sum(), out.attentions)
    relevance = torch.eye(8, dtype=torch.float64)
    for a, g in zip(out.attentions, grads, strict=True):
        cam = (g[0] * a[0]).clamp(min=0).mean(0).double()
        relevance = relevance + cam @ relevance
    assert torch.allclose(got, relevance[0], atol=1e-6)
    assert torch.allclose(views.attention_x_gradient(model, tokenizer, TEXT, first_token,
                                                     query="last"), relevance[-1], atol=1e-6)
    assert all(p.grad is None for p in model.parameters())  # no side effect on the model


def test_attention_x_gradient_errors_clearly_and_works_on_frozen_models(tokenizer):
    model = tiny_bert()
    with pytest.raises(InputError, match="inference_mode"), torch.inference_mode():
        views.attention_x_gradient(model, tokenizer, TEXT, first_token)
    with pytest.raises(InputError, match="no gradient"):
        views.attention_x_gradient(model, tokenizer, TEXT,
                                   lambda out, inputs: out.last_hidden_state[:, 0, 0].detach())

    def broken(out, inputs):
        raise RuntimeError("target failed")

    with pytest.raises(RuntimeError, match="target failed"):
        views.attention_x_gradient(model, tokenizer, TEXT, broken)
    assert ap.count_hooks(model) == 0
    trainable = views.attention_x_gradient(model, tokenizer, TEXT, first_token)
    model.requires_grad_(False)
    frozen = views.attention_x_gradient(model, tokenizer, TEXT, first_token)
    assert torch.allclose(trainable, frozen)
    assert ap.count_hooks(model) == 0


# ----------------------------------------------------------------------------- norm-based
def test_norm_based_equals_a_hand_computation_from_the_weights(tokenizer):
    model = tiny_bert("eager")
    inputs = tokenizer([TEXT], return_tensors="pt")
    with torch.no_grad():
        out = model(**inputs, output_attentions=True, output_hidden_states=True)
    n_heads, d_head = 2, 8
    for layer in (0, 1):
        got = views.norm_based(model, tokenizer, TEXT, layer=layer)
        block = model.encoder.layer[layer].attention
        with torch.no_grad():
            value = block.self.value(out.hidden_states[layer])[0].double()  # x W_V + b_V
        w_o = block.output.dense.weight.detach().double()  # [out, in]
        alpha = out.attentions[layer][0].double()
        expected = torch.empty(n_heads, 8, 8, dtype=torch.float64)
        for h in range(n_heads):
            cols = slice(h * d_head, (h + 1) * d_head)
            f = value[:, cols] @ w_o[:, cols].T  # [key, d_model], output bias excluded
            expected[h] = alpha[h] * f.norm(dim=-1)[None, :]
        assert got.shape == (n_heads, 8, 8)
        assert torch.allclose(got, expected, atol=1e-5)
    row = views.norm_importance(model, tokenizer, TEXT, layer=1, query="last")
    assert torch.allclose(row, views.norm_based(model, tokenizer, TEXT, layer=1).mean(0)[-1])


def _projection_inputs(module_path: str, model: torch.nn.Module):
    """Forward hook recording what the output projection receives and returns."""
    seen = {}

    def hook(module, args, output):
        seen["out"] = output.detach()

    return seen, model.get_submodule(module_path).register_forward_hook(hook)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_norm_vectors_rebuild_the_output_projection(family, tokenizer):
    # Σ_h Σ_j α_ij f^h(x_j) + b_O is what the output projection returns: checks the per-head
    # slicing of Conv1D ([in, out]) and nn.Linear ([out, in]) weights, GQA included
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=len(VOCAB), n_embd=16, n_layer=2, n_head=2,
                                         n_positions=32, initializer_range=0.3)
        model, path = transformers.GPT2Model(config), "h.1.attn.c_proj"
    else:
        config = transformers.LlamaConfig(
            vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=32, initializer_range=0.3)
        model, path = transformers.LlamaModel(config), "layers.1.self_attn.o_proj"
    model = track(model.eval())
    inputs = tokenizer([TEXT], return_tensors="pt")
    seen, handle = _projection_inputs(path, model)
    try:
        with torch.no_grad():
            model(input_ids=inputs["input_ids"])
    finally:
        handle.remove()
    parts, tokens = model_views.norm_parts(model, tokenizer, TEXT, [1])
    alpha, f = parts[1]
    bias = model.get_submodule(path).bias
    rebuilt = torch.einsum("hqk,hko->qo", alpha, f)
    if bias is not None:
        rebuilt = rebuilt + bias.detach().double()
    assert len(tokens) == 8
    assert torch.allclose(rebuilt, seen["out"][0].double(), atol=1e-5)


def test_norm_on_an_unsupported_model_names_the_supported_families(tokenizer):
    config = transformers.DistilBertConfig(vocab_size=len(VOCAB), dim=16, n_layers=1, n_heads=2,
                                           hidden_dim=32, max_position_embeddings=32)
    model = track(transformers.DistilBertModel(config).eval())
    with pytest.raises(InputError, match=r"bert.*gpt2.*llama"):
        views.norm_based(model, tokenizer, TEXT, layer=0)
    with pytest.raises(InputError, match="distilbert"):
        views.attention_importance(model, tokenizer, TEXT, views=["raw", "norm"])


# ----------------------------------------------------------------------------- all views
def test_attention_importance_names_every_view_and_layer(tokenizer):
    model = tiny_bert()
    builtin = ("attn_x_grad", "flow", "norm", "raw", "rollout")
    got = views.attention_importance(model, tokenizer, TEXT, Named(), example_id="e1",
                                     views=builtin)
    assert [a.method for a in got] == [
        "attn_x_grad", "flow@L0", "flow@L1", "norm@L0", "norm@L1", "raw@L0", "raw@L1",
        "rollout@L0", "rollout@L1"]
    # the default is every registered view, in name order (a view registered by a test too)
    default = views.attention_importance(model, tokenizer, TEXT, Named(), example_id="e1")
    assert [a.method for a in default if a.method.partition("@")[0] in builtin] == \
        [a.method for a in got]
    assert [a.method.partition("@")[0] for a in default] == sorted(
        a.method.partition("@")[0] for a in default)
    assert {a.target for a in got} == {"", "hidden:0"}
    assert next(a for a in got if a.method == "attn_x_grad").target == "hidden:0"
    tokens = ("[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]")
    assert all(a.tokens == tokens and a.example_id == "e1" for a in got)
    by = {a.method: a.scores for a in got}
    assert torch.allclose(by["flow@L0"], by["rollout@L0"], atol=1e-8)
    assert torch.allclose(by["norm@L1"],
                          views.norm_importance(model, tokenizer, TEXT, layer=1))
    one = views.attention_importance(model, tokenizer, TEXT, views=("rollout",), scope="layer:1",
                                     query="max")
    assert [a.method for a in one] == ["rollout@L1"] and one[0].target == ""
    assert torch.allclose(one[0].scores, views.rollout(ap.extract(model, tokenizer, TEXT)[0])[1]
                          .amax(0))


def test_attention_importance_refuses_bad_requests(tokenizer):
    model = tiny_bert()
    with pytest.raises(InputError, match="needs a target"):
        views.attention_importance(model, tokenizer, TEXT, views=["attn_x_grad"])
    with pytest.raises(InputError, match="views must be"):
        views.attention_importance(model, tokenizer, TEXT, views=["saliency"])
    with pytest.raises(InputError, match="views must be"):
        views.attention_importance(model, tokenizer, TEXT, views=["raw", "raw"])
    with pytest.raises(InputError, match="views must be"):
        views.attention_importance(model, tokenizer, TEXT, views=[])
    with pytest.raises(InputError, match="query must be"):
        views.attention_importance(model, tokenizer, TEXT, views=["raw"], query="middle")
    with pytest.raises(InputError, match="holds no head of layer 0"):
        views.attention_importance(model, tokenizer, TEXT, views=["raw"], scope="*.7")
    with pytest.raises(InputError, match="layer 5"):
        views.attention_importance(model, tokenizer, TEXT, views=["raw"], scope="layer:5")
    with pytest.raises(InputError, match="empty"):
        views.attention_importance(model, tokenizer, "  ", views=["raw"])


def test_minilm_views_agree_where_they_must():
    model, tok = ap.load_model("minilm")
    track(model)
    got = views.attention_importance(model, tok, "The cat sat on the mat.",
                                     views=("rollout", "flow", "norm"), scope="layers:0,5")
    by = {a.method: a.scores for a in got}
    assert torch.allclose(by["flow@L0"], by["rollout@L0"], atol=1e-7)
    for scores in by.values():
        assert torch.isfinite(scores).all() and (scores >= 0).all()
    assert by["flow@L5"].sum().item() == pytest.approx(1.0)
