"""AttnLRP rules (Achtibat et al. 2024): each rule's local conservation, and a one-layer example
propagated by hand in relevance form (no autograd) against the gradient × input functions.

Everything runs in float64; a tolerance is ``n · eps64 · Σ|terms|`` for a sum of ``n`` terms (the
rounding bound of a float sum), never a tuned constant.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnprobe.attribution.lrp_rules import (
    half_gradient,
    lrp_activation,
    lrp_layer_norm,
    lrp_linear,
    lrp_matmul,
    lrp_mul,
    lrp_rms_norm,
    lrp_softmax,
    relevance,
)
from attnprobe.errors import InputError

DT = torch.float64
EPS64 = torch.finfo(DT).eps


def tol(n_terms: int, *terms: torch.Tensor) -> float:
    """Rounding bound of float64 sums of ``n_terms`` terms of the given magnitudes."""
    return n_terms * EPS64 * sum(float(t.detach().abs().sum()) for t in terms) + 1e-300


def leaf(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=DT).requires_grad_(True)


def upstream(out: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward from ``out`` with a random modified gradient ``g``; returns ``(g, out ⊙ g)``."""
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=DT)
    out.backward(g)
    return g, out.detach() * g


def signed(z: torch.Tensor, eps: float) -> torch.Tensor:
    """Hand ε-rule denominator ``z + ε·sign(z)``, sign(0) = +1."""
    return z + eps * torch.where(z >= 0, torch.ones_like(z), -torch.ones_like(z))


@pytest.mark.parametrize("eps", [0.0, 1e-6, 0.5])
def test_linear_epsilon_rule_matches_the_textbook_rule_and_conserves_up_to_bias_and_epsilon(eps):
    x, w, b = leaf(3, 5, seed=0), torch.randn(4, 5, dtype=DT), torch.randn(4, dtype=DT)
    y = lrp_linear(x, w, b, epsilon=eps)
    assert torch.allclose(y, x.detach() @ w.T + b, rtol=0, atol=tol(5, x, w))
    _, r_out = upstream(y, seed=1)
    r_in = relevance(x.detach(), x.grad)
    z = y.detach()
    # R_i = Σ_j x_i W_ji / (z_j + ε') R'_j, written out
    hand = torch.einsum("ti,ji,tj->ti", x.detach(), w, r_out / signed(z, eps))
    assert torch.allclose(r_in, hand, rtol=0, atol=tol(4, hand))
    # Σ R = Σ_j (z_j − b_j)/(z_j + ε') R'_j: the bias and ε absorb the rest
    kept = ((z - b) / signed(z, eps) * r_out).sum()
    assert abs(float(r_in.sum() - kept)) <= tol(20, r_in)
    assert w.grad is None


def test_linear_without_bias_conserves_up_to_epsilon():
    eps = 1e-3
    x, w = leaf(6, 8, seed=2), torch.randn(7, 8, dtype=DT)
    y = lrp_linear(x, w, None, epsilon=eps)
    _, r_out = upstream(y, seed=3)
    z = y.detach()
    bound = float((r_out.abs() * eps / (z.abs() + eps)).sum())
    gap = abs(float(relevance(x.detach(), x.grad).sum() - r_out.sum()))
    assert gap <= bound + tol(56, r_out)


@pytest.mark.parametrize("fn", [F.gelu, F.silu, torch.tanh])
def test_identity_rule_passes_each_elements_relevance_on(fn):
    eps = 1e-6
    x = leaf(4, 9, seed=4)
    y = lrp_activation(x, fn, epsilon=eps)
    assert torch.equal(y, fn(x.detach()))
    _, r_out = upstream(y, seed=5)
    r_in = relevance(x.detach(), x.grad)
    xd = x.detach()
    assert torch.allclose(r_in, r_out * xd / signed(xd, eps), rtol=0, atol=tol(3, r_out))
    # conservation up to ε: |R − R'| ≤ |R'| ε / (|x| + ε) elementwise
    bound = r_out.abs() * eps / (xd.abs() + eps) + tol(3, r_out)
    assert bool(((r_in - r_out).abs() <= bound).all())


def test_identity_rule_at_zero_input_stays_finite():
    x = torch.zeros(3, dtype=DT, requires_grad=True)
    y = lrp_activation(x, torch.sigmoid, epsilon=1e-6)
    y.backward(torch.ones(3, dtype=DT))
    assert bool(torch.isfinite(x.grad).all())
    assert float(relevance(x.detach(), x.grad).abs().sum()) == 0


def test_softmax_rule_is_the_papers_formula_and_its_bias_term_closes_the_budget():
    x = leaf(2, 3, 5, seed=6)
    s = lrp_softmax(x, dim=-1)
    assert torch.allclose(s, torch.softmax(x.detach(), -1), rtol=0, atol=tol(5, s))
    _, r_out = upstream(s, seed=7)
    r_in = relevance(x.detach(), x.grad)
    xd, sd = x.detach(), s.detach()
    # R_i = x_i (R'_i − s_i Σ_j R'_j)
    hand = xd * (r_out - sd * r_out.sum(-1, keepdim=True))
    spread = xd * sd * r_out.abs().sum(-1, keepdim=True)
    assert torch.allclose(r_in, hand, rtol=0, atol=tol(5, xd * r_out, spread))
    # the Taylor expansion's bias absorbs Σ_j (1 − x_j + Σ_i s_i x_i) R'_j per row
    bias = ((1 - xd + (sd * xd).sum(-1, keepdim=True)) * r_out).sum(-1)
    budget = r_in.sum(-1) + bias
    assert torch.allclose(budget, r_out.sum(-1), rtol=0, atol=tol(20, hand, r_out, bias))


def test_softmax_rule_gives_masked_scores_zero_gradient_not_nan():
    x = torch.tensor([[0.3, -float("inf"), 1.2], [0.1, 0.4, -float("inf")]], dtype=DT,
                     requires_grad=True)
    s = lrp_softmax(x, dim=-1)
    s.backward(torch.tensor([[1.0, 2.0, -1.0], [0.5, 1.0, 3.0]], dtype=DT))
    assert bool(torch.isfinite(x.grad).all())
    assert float(x.grad[0, 1]) == 0 and float(x.grad[1, 2]) == 0


@pytest.mark.parametrize("shapes", [((2, 3, 4, 5), (2, 3, 5, 4)), ((2, 3, 4, 5), (1, 3, 5, 2))])
def test_uniform_matmul_rule_gives_each_factor_exactly_half(shapes):
    a, b = leaf(*shapes[0], seed=8), leaf(*shapes[1], seed=9)
    c = lrp_matmul(a, b)
    assert torch.allclose(c, a.detach() @ b.detach(), rtol=0, atol=tol(5, a, b))
    _, r_out = upstream(c, seed=10)
    r_a, r_b = relevance(a.detach(), a.grad), relevance(b.detach(), b.grad)
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    # R_a[ik] = ½ Σ_j a_ik b_kj / c_ij R'_ij, written out on the broadcast factors
    bb = b.detach().expand(*c.shape[:-2], *b.shape[-2:])
    hand_a = 0.5 * torch.einsum("...ik,...kj,...ij->...ik", a.detach(), bb, r_out / c.detach())
    scale = (torch.einsum("...ik,...kj->...ij", a.detach().abs(), bb.abs())
             * (r_out / c.detach()).abs())
    assert torch.allclose(r_a, hand_a, rtol=0, atol=tol(10, scale))
    half = 0.5 * float(r_out.sum())
    assert abs(float(r_a.sum()) - half) <= tol(40, scale)
    assert abs(float(r_b.sum()) - half) <= tol(40, scale)


def test_uniform_matmul_with_epsilon_loses_at_most_epsilon():
    eps = 1e-2
    a, b = leaf(3, 4, seed=11), leaf(4, 6, seed=12)
    c = lrp_matmul(a, b, epsilon=eps)
    _, r_out = upstream(c, seed=13)
    cd = c.detach()
    kept = 0.5 * (r_out * cd / signed(cd, eps)).sum()
    for factor in (a, b):
        assert abs(float(relevance(factor.detach(), factor.grad).sum() - kept)) <= tol(40, r_out)
    lost = float((r_out.abs() * eps / (cd.abs() + eps)).sum())
    assert abs(float(kept) - 0.5 * float(r_out.sum())) <= lost


def test_uniform_mul_rule_splits_each_product_in_halves():
    a, b = leaf(3, 7, seed=14), leaf(3, 7, seed=15)
    c = lrp_mul(F.silu(a), b)  # the gated MLP's act(gate) ⊙ up, act left to plain autograd here
    _, r_out = upstream(c, seed=16)
    r_b = relevance(b.detach(), b.grad)
    assert torch.allclose(r_b, r_out / 2, rtol=0, atol=tol(2, r_out))


def test_uniform_mul_broadcast_factor_receives_the_summed_half():
    a, b = leaf(4, 3, seed=17), leaf(1, 3, seed=18)
    c = lrp_mul(a, b)
    _, r_out = upstream(c, seed=19)
    assert b.grad.shape == b.shape
    assert torch.allclose(relevance(b.detach(), b.grad), r_out.sum(0, keepdim=True) / 2,
                          rtol=0, atol=tol(8, r_out))


def test_layer_norm_holds_the_std_and_its_shift_absorbs_beta_times_g():
    x = leaf(3, 6, seed=20)
    gamma, beta = torch.randn(6, dtype=DT), torch.randn(6, dtype=DT)
    y = lrp_layer_norm(x, (6,), gamma, beta, eps=1e-5)
    reference = F.layer_norm(x.detach(), (6,), gamma, beta, 1e-5)
    assert torch.allclose(y, reference, rtol=0, atol=tol(12, y))
    g, r_out = upstream(y, seed=21)
    r_in = relevance(x.detach(), x.grad)
    xd = x.detach()
    sigma = torch.sqrt(xd.var(-1, unbiased=False, keepdim=True) + 1e-5)
    # σ constant: y = γ (x − mean x)/σ + β is linear; its gradient, written out
    gg = gamma * g
    hand = xd * (gg - gg.mean(-1, keepdim=True)) / sigma
    assert torch.allclose(r_in, hand, rtol=0, atol=tol(12, xd * gg / sigma))
    kept = (r_out - beta * g).sum(-1)
    assert torch.allclose(r_in.sum(-1), kept, rtol=0, atol=tol(24, xd * gg / sigma))


def test_rms_norm_conserves_each_element_exactly():
    x = leaf(2, 3, 8, seed=22)
    gamma = torch.randn(8, dtype=DT)
    y = lrp_rms_norm(x, gamma, eps=1e-6)
    xd = x.detach()
    assert torch.allclose(y, gamma * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6),
                          rtol=0, atol=tol(8, y))
    _, r_out = upstream(y, seed=23)
    assert torch.allclose(relevance(xd, x.grad), r_out, rtol=0, atol=tol(2, r_out))


def test_bad_arguments_are_refused_in_one_line():
    x = torch.randn(2, 3, dtype=DT)
    with pytest.raises(InputError, match="epsilon"):
        lrp_linear(x, torch.randn(4, 3, dtype=DT), epsilon=-1.0)
    with pytest.raises(InputError, match="two matrices"):
        lrp_matmul(torch.randn(3, dtype=DT), x)
    with pytest.raises(InputError, match="no relevance"):
        relevance(x, None)


def hand_one_layer(x, wq, wk, wv, wo, w_read, eps, mask=0.0):
    """2-token, 1-head attention (additive ``mask``, as HF adds it) + residual + linear readout
    of the last token, propagated in relevance form by hand.

    Returns (logit, R_x, the softmax rule's bias term)."""
    d = wq.shape[1]
    q, k, v = x @ wq, x @ wk, x @ wv                    # (T, d)
    raw = q @ k.T                                       # (T, T)
    scores = raw / math.sqrt(d) + mask
    s = torch.softmax(scores, -1)
    o = s @ v                                           # (T, d)
    h = o @ wo                                          # (T, D)
    r = x + h
    logit = r[-1] @ w_read
    # readout ε-rule: R_r[last, i] = r_i w_i / (logit + ε') · logit
    r_r = torch.zeros_like(r)
    r_r[-1] = r[-1] * w_read / signed(logit, eps) * logit
    # residual: plain addition is LRP-0, split in proportion to the summands
    r_x = x / r * r_r
    r_h = h / r * r_r
    # output projection ε-rule
    r_o = torch.einsum("tk,ki,ti->tk", o, wo, r_h / signed(h, eps))
    # o = s v, uniform: half to s, half to v (exact, ε = 0)
    share = r_o / o                                     # (T, d)
    r_s = 0.5 * torch.einsum("tj,jk,tk->tj", s, v, share)
    r_v = 0.5 * torch.einsum("tj,jk,tk->jk", s, v, share)
    # softmax rule R_i = x_i (R'_i − s_i Σ_j R'_j); the 1/√d scale is linear, R passes unchanged
    r_raw = scores * (r_s - s * r_s.sum(-1, keepdim=True))
    softmax_bias = ((1 - scores + (s * scores).sum(-1, keepdim=True)) * r_s).sum()
    # raw = q kᵀ, uniform
    share = r_raw / raw
    r_q = 0.5 * torch.einsum("ta,ja,tj->ta", q, k, share)
    r_k = 0.5 * torch.einsum("ta,ja,tj->ja", q, k, share)
    # the three projections, ε-rule, each onto x
    for w, z, r_z in ((wq, q, r_q), (wk, k, r_k), (wv, v, r_v)):
        r_x = r_x + torch.einsum("ti,ia,ta->ti", x, w, r_z / signed(z, eps))
    return logit, r_x, softmax_bias


def rules_one_layer(x, wq, wk, wv, wo, w_read, eps, mask=0.0):
    """The same layer through the autograd rules; returns (logit, R_x = x ⊙ x.grad)."""
    x = x.clone().requires_grad_(True)
    d = wq.shape[1]
    q, k, v = (lrp_linear(x, w.T, None, eps) for w in (wq, wk, wv))
    scores = lrp_matmul(q, k.T) / math.sqrt(d) + mask
    o = lrp_matmul(lrp_softmax(scores, -1), v)
    r = x + lrp_linear(o, wo.T, None, eps)
    logit = lrp_linear(r[-1:], w_read[None, :], None, eps)[0, 0]
    logit.backward()
    return logit.detach(), relevance(x.detach(), x.grad)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("eps", [0.0, 1e-6, 0.1])
def test_one_layer_attention_matches_hand_propagated_relevance(eps, causal):
    gen = torch.Generator().manual_seed(24)
    D, d = 4, 3
    x = torch.randn(2, D, generator=gen, dtype=DT)
    wq, wk, wv = (torch.randn(D, d, generator=gen, dtype=DT) for _ in range(3))
    wo, w_read = torch.randn(d, D, generator=gen, dtype=DT), torch.randn(D, generator=gen, dtype=DT)
    # HF's causal mask: the most negative finite number above the diagonal
    mask = torch.triu(torch.full((2, 2), torch.finfo(DT).min, dtype=DT), 1) if causal else 0.0
    logit, r_x = rules_one_layer(x, wq, wk, wv, wo, w_read, eps, mask)
    hand_logit, hand_r, softmax_bias = hand_one_layer(x, wq, wk, wv, wo, w_read, eps, mask)
    assert bool(torch.isfinite(hand_r).all()) and bool(torch.isfinite(r_x).all())
    assert abs(float(logit - hand_logit)) <= tol(40, hand_logit)
    # ~8 rules on the path, each a sum of ≤ 8 rounded terms: 64 roundings of the total
    assert torch.allclose(r_x, hand_r, rtol=0, atol=tol(64, hand_r) + tol(64, logit))
    assert hand_r[0].abs().sum() > 0  # the first token receives relevance only through attention
    if eps == 0:
        # every other rule is exact at ε = 0: the conservation gap is the softmax bias alone
        gap = float(r_x.sum() - logit)
        assert abs(gap + float(softmax_bias)) <= tol(64, hand_r, logit, softmax_bias)


def test_one_layer_attention_in_float32_matches_the_float64_hand_reference():
    """The rules in a model's own precision: float32 against the float64 hand propagation."""
    gen = torch.Generator().manual_seed(27)
    D, d = 4, 3
    x = torch.randn(2, D, generator=gen, dtype=DT)
    wq, wk, wv = (torch.randn(D, d, generator=gen, dtype=DT) for _ in range(3))
    wo, w_read = torch.randn(d, D, generator=gen, dtype=DT), torch.randn(D, generator=gen, dtype=DT)
    weights = (wq, wk, wv, wo, w_read)
    _, r32 = rules_one_layer(x.float(), *(w.float() for w in weights), 1e-6)
    _, hand_r, _ = hand_one_layer(x, *weights, 1e-6)
    # ~8 rules on the path, each a sum of ≤ 8 rounded terms: 64 roundings of the total
    atol = 64 * torch.finfo(torch.float32).eps * float(hand_r.abs().sum())
    assert r32.dtype == torch.float32
    assert torch.allclose(r32.double(), hand_r, rtol=0, atol=atol)


def test_llama_layout_mlp_block_conserves_relevance_up_to_the_activations_epsilon():
    """RMS norm → gated MLP (SiLU) → residual, every linear at ε = 0: only the identity rule's
    ε on the gate can lose relevance, at most Σ|R_gate| ε / (|gate| + ε)."""
    eps = 1e-9
    x = leaf(3, 6, seed=25)
    gamma = torch.randn(6, dtype=DT)
    w_gate, w_up, w_down = torch.randn(10, 6, dtype=DT), torch.randn(10, 6, dtype=DT), \
        torch.randn(6, 10, dtype=DT)
    normed = lrp_rms_norm(x, gamma)
    gate = lrp_linear(normed, w_gate, epsilon=0.0)
    gate.retain_grad()
    act = lrp_activation(gate, F.silu, epsilon=eps)
    out = x + lrp_linear(lrp_mul(act, lrp_linear(normed, w_up, epsilon=0.0)), w_down, epsilon=0.0)
    _, r_out = upstream(out, seed=26)
    r_gate = relevance(gate.detach(), gate.grad)
    lost = float((r_gate.abs() * eps / (gate.detach().abs() + eps)).sum())
    gap = abs(float(relevance(x.detach(), x.grad).sum() - r_out.sum()))
    assert gap <= lost + tol(200, r_out, r_gate)


def test_softmax_rule_in_gradient_form_is_the_ordinary_softmax_gradient():
    """Prop. 3.1 expands at the input itself, so x ⊙ ∇ is the rule: plain autograd through
    ``torch.softmax`` gives the same modified gradient (a model's own softmax needs no patch)."""
    x, x_plain = leaf(3, 4, seed=28), leaf(3, 4, seed=28)
    g = torch.randn(3, 4, generator=torch.Generator().manual_seed(29), dtype=DT)
    lrp_softmax(x, dim=-1).backward(g)
    torch.softmax(x_plain, dim=-1).backward(g)
    assert torch.allclose(x.grad, x_plain.grad, rtol=0, atol=tol(8, g))


def test_halving_both_factors_of_a_plain_product_is_the_uniform_rule():
    """``half_gradient(a) * half_gradient(b)`` (a model's own ``*``) has the backward of
    :func:`lrp_mul` at ε = 0: each factor receives exactly half of the product's relevance."""
    a, b = leaf(3, 5, seed=41), leaf(3, 5, seed=42)
    out = half_gradient(a) * half_gradient(b)
    _, r_out = upstream(out, seed=43)
    a2, b2 = a.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
    upstream(lrp_mul(a2, b2), seed=43)
    assert torch.equal(a.grad, a2.grad) and torch.equal(b.grad, b2.grad)
    r_a = relevance(a.detach(), a.grad)
    assert torch.allclose(r_a, r_out / 2, rtol=0, atol=tol(2, r_out))
    assert torch.equal(half_gradient(a), a)
