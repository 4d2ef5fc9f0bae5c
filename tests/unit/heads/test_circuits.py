"""QK/OV circuits and composition scores from the weights (docs/guide/causal-methods.md):
values known by construction (identity OV → copying score 1, orthogonal subspaces →
composition 0, aligned rank-one circuits → 1), equal to explicit ``d_model × d_model`` /
``vocab × vocab`` products built here from the modules' own weights (norms folded by hand,
each query head with its shared KV head), a random baseline checked against an independent
draw, and one-line errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.heads.head_composition import COLUMNS, composition
from attnprobe.heads.qk_ov import Circuits, circuits
from attnprobe.models.decoder_only import LlamaConfig, LlamaModel
from attnprobe.weights.head_weights import read_norm
from tests.conftest import track
from tests.helpers import bert_vocab, tiny_bert
from tests.integration.causal_lms import causal_lm
from tests.unit.heads.test_logit_attribution import with_biases


def attention_only(n_layers: int = 2, d_model: int = 8, n_heads: int = 2, n_kv: int = 2,
                   vocab: int = 12) -> LlamaModel:
    """A reference LLaMA-style attention-only model (RMSNorm weights 1) to set by hand."""
    torch.manual_seed(0)
    return track(LlamaModel(LlamaConfig(vocab, d_model=d_model, n_layers=n_layers,
                                        n_heads=n_heads, n_kv_heads=n_kv,
                                        attention_only=True)).eval())


def set_head(attn, head: int, *, q=None, k=None, v=None, o=None) -> None:
    """Write one head's ``[d_model, d_head]`` (``o``: ``[d_head, d_model]``) weights in row
    convention into the module's ``[out, in]`` Linear weights."""
    d = attn.d_head
    with torch.no_grad():
        for proj, value in ((attn.q_proj, q), (attn.k_proj, k), (attn.v_proj, v)):
            if value is not None:
                proj.weight[head * d:(head + 1) * d] = value.T
        if o is not None:
            attn.out_proj.weight[:, head * d:(head + 1) * d] = o.T


# ----------------------------------------------------------------------------- by construction
def test_identity_ov_copies_and_negated_identity_anti_copies():
    model = attention_only(n_layers=1, d_model=8, n_heads=1, n_kv=1)
    eye = torch.eye(8)
    set_head(model.blocks[0].attn, 0, v=eye, o=eye)
    with torch.no_grad():  # W_U = W_Eᵀ: W_E W_OV W_U = W_E W_Eᵀ, positive semi-definite
        model.unembed.weight.copy_(model.embed.weight)
    found = circuits(model)
    assert found.table["copying_score"].item() == pytest.approx(1.0, abs=1e-9)
    assert found.table["positive_share"].item() == pytest.approx(1.0, abs=1e-9)
    set_head(model.blocks[0].attn, 0, o=-eye)
    again = circuits(model)
    assert again.table["copying_score"].item() == pytest.approx(-1.0, abs=1e-9)
    assert again.table["positive_share"].item() == pytest.approx(0.0, abs=1e-9)


def test_orthogonal_subspaces_compose_zero_and_aligned_rank_one_circuits_compose_one():
    model = attention_only()
    g = torch.Generator().manual_seed(1)
    writes, reads = torch.arange(8) < 4, (torch.arange(8) >= 4)[:, None]
    first, second = model.blocks[0].attn, model.blocks[1].attn
    for h in range(2):  # layer 0 writes only into dims 0..3; layer 1 reads only dims 4..7
        set_head(first, h, o=torch.randn(4, 8, generator=g) * writes)
        set_head(second, h, q=torch.randn(8, 4, generator=g) * reads,
                 k=torch.randn(8, 4, generator=g) * reads,
                 v=torch.randn(8, 4, generator=g) * reads)
    scores = composition(model, n_draws=4)
    assert list(scores.table.columns) == COLUMNS
    assert scores.table["score"].abs().max() < 1e-6
    # K-composition of rank-one circuits: W_OV^A = a ⊗ w, W_QK^B = p ⊗ key with key ∥ w
    a, w, p = (torch.randn(8, generator=g) for _ in range(3))
    zero = torch.zeros(8, 4)
    set_head(first, 0, v=torch.cat([a[:, None], zero[:, 1:]], 1),
             o=torch.cat([w[None], torch.zeros(3, 8)], 0))
    set_head(second, 0, q=torch.cat([p[:, None], zero[:, 1:]], 1),
             k=torch.cat([(2 * w)[:, None], zero[:, 1:]], 1))
    k = composition(model, kinds=["k"], n_draws=4).table
    pair = k[(k["writer_head"] == 0) & (k["reader_head"] == 0)]["score"].item()
    assert pair == pytest.approx(1.0, abs=1e-9)


# ----------------------------------------------------------------------------- by hand
def folded_by_hand(model, layer: int) -> dict[str, torch.Tensor]:
    """Row-convention ``[d_model, ·]`` matrices of a transformers LLaMA-layout layer with its
    RMSNorm weight folded, per *query* head (its KV head is ``h // group``)."""
    block = model.model.layers[layer]
    attn, w = block.self_attn, block.input_layernorm.weight.detach()
    d, n, kv = attn.head_dim, 4, 2
    out = {}
    for h in range(n):
        g = h // (n // kv)
        out[f"q{h}"] = (attn.q_proj.weight[h * d:(h + 1) * d].T * w[:, None]).detach()
        out[f"k{h}"] = (attn.k_proj.weight[g * d:(g + 1) * d].T * w[:, None]).detach()
        out[f"v{h}"] = (attn.v_proj.weight[g * d:(g + 1) * d].T * w[:, None]).detach()
        out[f"o{h}"] = attn.o_proj.weight[:, h * d:(h + 1) * d].T.detach()
    return out


@pytest.fixture(scope="module")
def llama():
    model, _ = causal_lm("llama")  # 4 query heads on 2 distinct random KV heads
    with torch.no_grad():
        for layer in model.model.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
        model.model.norm.weight.uniform_(0.5, 1.5)
    return model


def test_gqa_heads_pair_with_their_own_kv_head(llama):
    found = circuits(llama)
    assert found.kv_heads == ((0, 0, 1, 1), (0, 0, 1, 1))
    for layer in range(2):
        hand = folded_by_hand(llama, layer)
        for h in range(4):
            qk = hand[f"q{h}"] @ hand[f"k{h}"].T
            ov = hand[f"v{h}"] @ hand[f"o{h}"]
            assert torch.allclose(found.qk(layer, h).full(), qk, atol=1e-5)
            assert torch.allclose(found.ov(layer, h).full(), ov, atol=1e-5)
            other = hand[f"q{h}"] @ hand[f"k{(h + 2) % 4}"].T  # the other KV head
            assert not torch.allclose(found.qk(layer, h).full(), other, atol=1e-3)


def test_composition_equals_explicit_d_model_products(llama):
    found = composition(llama, n_draws=4).table
    a, b = folded_by_hand(llama, 0), folded_by_hand(llama, 1)
    for w in range(4):
        ov_a = a[f"v{w}"] @ a[f"o{w}"]
        for r in range(4):
            qk_b = b[f"q{r}"] @ b[f"k{r}"].T
            ov_b = b[f"v{r}"] @ b[f"o{r}"]
            want = {"q": (ov_a @ qk_b).norm() / (ov_a.norm() * qk_b.norm()),
                    "k": (qk_b @ ov_a.T).norm() / (ov_a.norm() * qk_b.norm()),
                    "v": (ov_a @ ov_b).norm() / (ov_a.norm() * ov_b.norm())}
            for kind, value in want.items():
                got = found[(found["kind"] == kind) & (found["writer_head"] == w)
                            & (found["reader_head"] == r)]["score"].item()
                assert got == pytest.approx(float(value), rel=1e-4)


def test_copying_score_equals_the_eigenvalues_of_the_vocab_product(llama):
    found = circuits(llama)
    for layer, head in ((0, 1), (1, 3)):
        full = found.full_ov(layer, head).double()  # [vocab, vocab] = 100 × 100
        hand = folded_by_hand(llama, layer)
        W_U = llama.lm_head.weight.T.detach() * llama.model.norm.weight.detach()[:, None]
        explicit = llama.model.embed_tokens.weight.detach() @ hand[f"v{head}"] \
            @ hand[f"o{head}"] @ W_U
        assert torch.allclose(full, explicit.double(), atol=1e-4)
        eig = torch.linalg.eigvals(full)
        want = float(eig.sum().real / eig.abs().sum())
        row = found.table[(found.table["layer"] == layer) & (found.table["head"] == head)]
        assert row["copying_score"].item() == pytest.approx(want, abs=1e-4)
    subset = found.full_ov(1, 3, tokens=[5, 9, 11])
    assert torch.allclose(subset, found.full_ov(1, 3)[[5, 9, 11]][:, [5, 9, 11]], atol=1e-5)


def test_layernorm_folding_reproduces_the_query_of_gpt2():
    model, _ = causal_lm("gpt2")
    model = with_biases(model)
    found = circuits(model)
    block = model.transformer.h[1]
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        q_model = block.attn.c_attn(block.ln_1(x))[:, :32].view(5, 4, 8)  # [row, head, d]
    xhat = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True)
                                             + block.ln_1.eps).sqrt()
    layer = found.layers[1]
    for h in range(4):
        q = xhat @ layer.W_Q[h] + layer.b_Q[h]
        assert torch.allclose(q, q_model[:, h], atol=1e-4)


def test_random_baseline_matches_an_independent_draw(llama):
    comp = composition(llama, n_draws=16, seed=3)
    d, dh = 32, 8
    rng = np.random.default_rng(0)
    sums = {"q": [], "k": [], "v": []}
    for _ in range(200):
        v, o, q, k, v2, o2 = (rng.standard_normal(s) for s in
                              ((d, dh), (dh, d), (d, dh), (d, dh), (d, dh), (dh, d)))
        ov, qk, ov2 = v @ o, q @ k.T, v2 @ o2
        f = np.linalg.norm
        sums["q"].append(f(ov @ qk) / (f(ov) * f(qk)))
        sums["k"].append(f(qk @ ov.T) / (f(ov) * f(qk)))
        sums["v"].append(f(ov @ ov2) / (f(ov) * f(ov2)))
    for kind in "qkv":
        assert comp.baseline(kind) == pytest.approx(np.mean(sums[kind]), rel=0.05)
    assert composition(llama, n_draws=16, seed=3).baseline("k") == comp.baseline("k")
    assert 0.5 / math.sqrt(d) < comp.baseline("k") < 4 / math.sqrt(d)


# ----------------------------------------------------------------------------- norms
def test_norms_are_read_by_what_they_do():
    class GemmaLike(torch.nn.Module):  # x / rms · (1 + w), no attribute says so
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.linspace(-0.5, 0.5, 6))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + self.weight)

    spec = read_norm(GemmaLike(), 6)
    assert not spec.centred and spec.bias is None
    assert torch.allclose(spec.weight, 1 + torch.linspace(-0.5, 0.5, 6).double(), atol=1e-6)
    plain = read_norm(torch.nn.LayerNorm(6, elementwise_affine=False), 6)
    assert plain.centred and torch.allclose(plain.weight, torch.ones(6).double(), atol=1e-6)
    with pytest.raises(InputError, match="neither a LayerNorm nor an RMSNorm"):
        read_norm(torch.nn.Tanh(), 6)


# ----------------------------------------------------------------------------- results, errors
def test_results_print_one_line_and_note_rope():
    model, _ = ap.load_model("ref:llama")
    found = circuits(model)
    assert isinstance(found, Circuits) and found.rope
    assert any("RoPE" in note for note in found.notes)
    for obj, name in ((found, "Circuits("), (composition(found, n_draws=4), "Composition(")):
        text = repr(obj)
        assert text.startswith(name) and "\n" not in text and "RoPE" in text
        html = obj._repr_html_()
        assert html is None or "L1H0" in html
    assert "2 KV heads" in repr(found)
    assert repr(found.qk(0, 0)).startswith("Factored(32 × 32")


def test_one_line_errors():
    model = attention_only(n_layers=1)
    with pytest.raises(InputError, match="composition needs a later layer"):
        composition(model)
    found = circuits(attention_only())
    for call, match in ((lambda: composition(found, kinds=["x"]), "unknown composition kind"),
                        (lambda: composition(found, n_draws=1), "n_draws"),
                        (lambda: found.qk(2, 0), "layer 2 out of range"),
                        (lambda: found.ov(0, 5), "head 5 out of range"),
                        (lambda: found.full_ov(0, 0, tokens=[99]), "tokens must be ids")):
        with pytest.raises(InputError, match=match) as err:
            call()
        assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="post-norm"):
        circuits(tiny_bert(bert_vocab()))


def test_a_large_vocabulary_needs_named_tokens_for_the_full_circuit():
    model = attention_only(n_layers=1, vocab=9000)
    found = circuits(model)
    with pytest.raises(InputError, match="pass tokens="):
        found.full_qk(0, 0)
    assert found.full_qk(0, 0, tokens=[1, 2]).shape == (2, 2)
