"""Bahdanau, Luong (dot/general/concat) and Luong local attention against hand-written
formulas and against seed 002's own code."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnprobe.errors import InputError
from attnprobe.models.rnn_attention import BahdanauAttention, LocalAttention, LuongAttention
from tests.conftest import track

B, SRC, D = 2, 7, 6


def _inputs(seed: int = 0, d_query: int = D, src: int = SRC) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, d_query, generator=g), torch.randn(B, src, D, generator=g)


def _softmax_context(scores: torch.Tensor, keys: torch.Tensor):
    weights = torch.softmax(scores, dim=1)  # [batch, src]
    return (weights[:, :, None] * keys).sum(1), weights


# --- seed 002's classes (the reference the modules must follow), copied verbatim except one
# fix: for dot/general the seed's energy is [batch, 1, src], so its ``energy.squeeze(-1)`` is a
# no-op and ``softmax(dim=1)`` runs over the singleton axis (all weights 1, then bmm fails on a
# 4-d tensor). The fix flattens the energy to [batch, src] for every variant.
class SeedBahdanauAttention(nn.Module):
    def __init__(self, hidden_size):
        super().__init__()
        self.W_a = nn.Linear(hidden_size, hidden_size)
        self.U_a = nn.Linear(hidden_size, hidden_size)
        self.v_a = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, decoder_hidden, encoder_outputs):
        decoder_hidden = decoder_hidden.unsqueeze(1)
        energy = torch.tanh(self.W_a(decoder_hidden) + self.U_a(encoder_outputs))
        attention_scores = self.v_a(energy).squeeze(-1)
        attention_weights = F.softmax(attention_scores, dim=1)
        context = torch.bmm(attention_weights.unsqueeze(1), encoder_outputs)
        return context.squeeze(1), attention_weights


class SeedLuongAttention(nn.Module):
    def __init__(self, hidden_size, variant="general"):
        super().__init__()
        self.variant = variant
        if variant == "general":
            self.W_a = nn.Linear(hidden_size, hidden_size, bias=False)
        elif variant == "concat":
            self.W = nn.Linear(2 * hidden_size, hidden_size)
            self.v_a = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, decoder_hidden, encoder_outputs):
        decoder_hidden = decoder_hidden.unsqueeze(1)
        if self.variant == "dot":
            energy = torch.bmm(decoder_hidden, encoder_outputs.transpose(1, 2))
        elif self.variant == "general":
            energy = torch.bmm(self.W_a(decoder_hidden), encoder_outputs.transpose(1, 2))
        else:
            expanded = decoder_hidden.repeat(1, encoder_outputs.size(1), 1)
            concat_input = torch.cat([expanded, encoder_outputs], dim=-1)
            energy = self.v_a(torch.tanh(self.W(concat_input)))
        energy = energy.reshape(energy.shape[0], -1)  # FIX (seed: energy.squeeze(-1))
        attention_weights = F.softmax(energy, dim=1)
        context = torch.bmm(attention_weights.unsqueeze(1), encoder_outputs)
        return context.squeeze(1), attention_weights


def test_seed_luong_code_softmaxes_over_the_wrong_axis_for_dot_and_general():
    """Documents the seed bug fixed above: its unfixed line gives weights of exactly 1."""
    q, k = _inputs()
    energy = torch.bmm(q.unsqueeze(1), k.transpose(1, 2))  # the seed's dot energy
    assert torch.equal(F.softmax(energy.squeeze(-1), dim=1), torch.ones(B, 1, SRC))


def test_modules_reproduce_seed_002_code_with_the_same_weights():
    q, k = _inputs()
    pairs = [(BahdanauAttention(D, D), SeedBahdanauAttention(D))]
    pairs += [(LuongAttention(D, D, v), SeedLuongAttention(D, v))
              for v in ("dot", "general", "concat")]
    for ours, seed in pairs:
        seed.load_state_dict(ours.score.state_dict())
        context, weights = ours(q, k)
        seed_context, seed_weights = seed(q, k)
        assert torch.allclose(weights, seed_weights, atol=1e-6)
        assert torch.allclose(context, seed_context, atol=1e-6)


def test_bahdanau_formula_with_different_sizes():
    attn = BahdanauAttention(d_query=4, d_key=D, d_attn=5)
    q, k = _inputs(d_query=4)
    s = attn.score
    # e_s = v_aᵀ tanh(W_a q + b_W + U_a k_s + b_U), written out with matrices
    hidden = torch.tanh(
        (q @ s.W_a.weight.T + s.W_a.bias)[:, None, :] + k @ s.U_a.weight.T + s.U_a.bias)
    scores = (hidden @ s.v_a.weight.T).squeeze(-1)
    context, weights = attn(q, k)
    expected_context, expected = _softmax_context(scores, k)
    assert torch.allclose(weights, expected, atol=1e-6)
    assert torch.allclose(context, expected_context, atol=1e-6)


def test_luong_general_and_concat_formulas():
    q, k = _inputs(d_query=4)
    general = LuongAttention(4, D, "general")
    w = general.score.W_a.weight  # [d_key, d_query]
    scores = torch.einsum("bq,kq,bsk->bs", q, w, k)  # qᵀ W_aᵀ k_s
    assert torch.allclose(general(q, k)[1], torch.softmax(scores, 1), atol=1e-6)

    concat = LuongAttention(4, D, "concat", d_attn=3)
    lin, v = concat.score.W, concat.score.v_a.weight[0]
    with torch.no_grad():
        rows = torch.stack([torch.stack(
            [v @ torch.tanh(lin.weight @ torch.cat([q[b], k[b, j]]) + lin.bias)
             for j in range(SRC)]) for b in range(B)])
    assert torch.allclose(concat(q, k)[1], torch.softmax(rows, 1), atol=1e-6)


def test_luong_dot_equals_general_with_identity_and_the_plain_dot_product():
    q, k = _inputs()
    general = LuongAttention(D, D, "general")
    with torch.no_grad():
        general.score.W_a.weight.copy_(torch.eye(D))
    dot_context, dot_weights = LuongAttention(D, D, "dot")(q, k)
    gen_context, gen_weights = general(q, k)
    assert torch.allclose(dot_weights, gen_weights) and torch.allclose(dot_context, gen_context)
    expected = torch.softmax(torch.stack([k[b] @ q[b] for b in range(B)]), 1)
    assert torch.allclose(dot_weights, expected, atol=1e-6)


@pytest.mark.parametrize("make", [lambda: BahdanauAttention(D, D),
                                  lambda: LuongAttention(D, D, "concat"),
                                  lambda: LocalAttention(D, D, 1, "predictive")])
def test_padded_keys_get_zero_weight_and_change_nothing(make):
    attn = make()
    q, k = _inputs()
    junk = 50 * torch.randn(B, 3, D)
    context, weights = attn(q, k)
    mask = torch.tensor([[0, 0, 0] + [1] * SRC, [0, 0, 0] + [1] * SRC])  # left padding
    padded_context, padded_weights = attn(q, torch.cat([junk, k], 1), mask)
    assert torch.all(padded_weights[:, :3] == 0)
    assert torch.allclose(padded_weights[:, 3:], weights, atol=1e-6)
    assert torch.allclose(padded_context, context, atol=1e-6)


def test_hooks_are_single_query_rows_and_an_edit_reaches_the_context():
    attn = track(LuongAttention(D, D, "general"))
    q, k = _inputs()
    seen = []
    handle = attn.hook_scores.register_forward_hook(lambda m, a, o: seen.append(o))
    try:
        attn(q, k)
    finally:
        handle.remove()
    assert seen[0].shape == (B, 1, 1, SRC)
    uniform = torch.full((B, 1, 1, SRC), 1 / SRC)
    handle = attn.hook_pattern.register_forward_hook(lambda m, a, o: uniform)
    try:
        context, weights = attn(q, k)
    finally:
        handle.remove()
    assert torch.allclose(weights, uniform[:, 0, 0])
    # two float32 sums over the SRC keys in different orders: at most SRC ulps of max |k|
    # apart (torch's default rtol failed near zero entries under ATEN_CPU_CAPABILITY=default)
    bound = SRC * torch.finfo(torch.float32).eps * k.abs().max().item()
    torch.testing.assert_close(context, k.mean(1), atol=bound, rtol=0)


@pytest.mark.parametrize("step", [0, 1, 3, 6, 9])
def test_local_m_window_is_exactly_t_minus_d_to_t_plus_d(step):
    window = 2
    attn = LocalAttention(D, D, window, "monotonic", "general")
    q, k = _inputs()
    _, weights = attn(q, k, step=step)
    p = min(step, SRC - 1)  # the centre is clamped to the last source position
    inside = torch.tensor([abs(s - p) <= window for s in range(SRC)])
    assert torch.all(weights[:, ~inside] == 0) and torch.all(weights[:, inside] > 0)
    # inside the window: Luong's align = softmax of the general score over the window
    scores = torch.einsum("bq,kq,bsk->bs", q, attn.score.W_a.weight, k)[:, inside]
    assert torch.allclose(weights[:, inside], torch.softmax(scores, 1), atol=1e-6)


def test_local_p_follows_luong_with_a_gaussian_and_normalised_rows():
    window = 2
    attn = LocalAttention(D, D, window, "predictive", "dot")
    q, k = _inputs(seed=3)
    mask = torch.ones(B, SRC, dtype=torch.long)
    mask[1, 5:] = 0  # example 1 has S = 5 real tokens
    _, weights = attn(q, k, mask)
    sigma = window / 2
    for b, length in enumerate((SRC, 5)):
        gate = torch.sigmoid(attn.v_p.weight @ torch.tanh(attn.W_p.weight @ q[b])).detach()
        p = float(length * gate)  # p_t = S · sigmoid(v_pᵀ tanh(W_p h_t))
        window_s = [s for s in range(length) if abs(s - p) <= window]
        align = torch.softmax(torch.stack([k[b, s] @ q[b] for s in window_s]), 0)
        paper = align * torch.tensor([math.exp(-((s - p) ** 2) / (2 * sigma**2))
                                      for s in window_s])
        expected = torch.zeros(SRC)
        expected[window_s] = paper / paper.sum()  # the paper's weights, renormalised
        assert torch.allclose(weights[b], expected, atol=1e-6)
    assert torch.allclose(weights.sum(1), torch.ones(B))


def test_bad_inputs_raise_input_error():
    q, k = _inputs()
    with pytest.raises(InputError, match="window 2D\\+1 = 9 is larger than the source"):
        LocalAttention(D, D, 4, "monotonic")(q, k, step=0)
    with pytest.raises(InputError, match="larger than the source"):  # real length counts
        LocalAttention(D, D, 2, "predictive")(q, k, torch.tensor([[1] * SRC, [1] * 4 + [0] * 3]))
    with pytest.raises(InputError, match="needs step"):
        LocalAttention(D, D, 1, "monotonic")(q, k)
    with pytest.raises(InputError, match="window D must be >= 1"):
        LocalAttention(D, D, 0, "predictive")
    with pytest.raises(InputError, match="d_query == d_key"):
        LuongAttention(4, D, "dot")
    with pytest.raises(InputError, match="unknown Luong variant"):
        LuongAttention(D, D, "bilinear")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="query must be"):
        BahdanauAttention(D, D)(q[0], k)
    with pytest.raises(InputError, match="do not fit"):
        BahdanauAttention(D, D)(torch.zeros(B, 4), k)
    with pytest.raises(InputError, match="no key"):
        BahdanauAttention(D, D)(q, k, torch.zeros(B, SRC))
