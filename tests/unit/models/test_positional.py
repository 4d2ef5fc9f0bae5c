"""Positional schemes: formulas checked against independently written math, the symmetry each
one breaks, and the four reference models (capture, padding, the edit seam).

The seed text says self-attention without positions is permutation-*invariant* ("outputs do not
change"); what holds, and what is tested here, is permutation-*equivariance*: the outputs and the
[query, key] maps permute the same way as the tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnprobe
from attnprobe.errors import InputError
from attnprobe.models.positional import (
    PositionalAttention,
    PositionalConfig,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    sinusoidal_table,
)
from attnprobe.models.zoo import build_reference
from tests.conftest import track

NAMES = ["sinusoidal", "rope", "alibi", "nopos"]
TEXTS = ["The cat sat on the mat.", "A dog ran.", "the quick brown fox jumps over the lazy dog"]


# ------------------------------------------------------------------ sinusoidal table
@pytest.mark.parametrize("d_model", [6, 7])
def test_sinusoidal_table_follows_vaswani(d_model):
    table = sinusoidal_table(11, d_model)
    assert table.shape == (11, d_model)
    for pos in range(11):
        for col in range(d_model):
            i = col // 2
            angle = pos / 10000 ** (2 * i / d_model)
            want = math.sin(angle) if col % 2 == 0 else math.cos(angle)
            assert abs(float(table[pos, col]) - want) < 1e-6, (pos, col)


@pytest.mark.parametrize("k", [1, 3, 10])
def test_sinusoidal_shift_is_one_fixed_linear_map(k):
    d, n = 16, 50
    table = sinusoidal_table(n + k, d).double()
    # M_k: 2x2 blocks acting on (sin, cos) pairs: sin(a+b) = sin a cos b + cos a sin b,
    # cos(a+b) = cos a cos b - sin a sin b, with b = k·ω_i.
    m = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        w = k / 10000 ** (2 * i / d)
        m[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(
            [[math.cos(w), math.sin(w)], [-math.sin(w), math.cos(w)]], dtype=torch.float64
        )
    shifted = table[:n] @ m.T  # row pos -> M_k · PE(pos)
    torch.testing.assert_close(shifted, table[k : n + k], atol=2e-6, rtol=0)


# ------------------------------------------------------------------------------ RoPE
def test_rope_pairs_half_split_features_with_known_angles():
    base, p = 10000.0, 3
    x = torch.eye(4)[None, None]  # [1, 1, 4 "tokens", 4]: one unit vector per row
    out = apply_rope(x, torch.full((4,), p), base)[0, 0]
    slow = p * base ** (-2 / 4)  # θ_1 = base^(-2·1/4)
    c0, s0, c1, s1 = math.cos(p), math.sin(p), math.cos(slow), math.sin(slow)
    want = torch.tensor([  # pairs are (0, 2) at θ_0 = 1 and (1, 3) at θ_1
        [c0, 0, s0, 0],
        [0, c1, 0, s1],
        [-s0, 0, c0, 0],
        [0, -s1, 0, c1],
    ])
    torch.testing.assert_close(out, want, atol=1e-6, rtol=0)


def test_rope_preserves_norms_and_position_zero_is_identity():
    x = torch.randn(2, 3, 7, 8)
    pos = torch.randint(0, 50, (2, 7))
    out = apply_rope(x, pos)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(apply_rope(x, torch.zeros(7)), x)


def test_rope_scores_depend_only_on_the_offset():
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    pos = torch.tensor([0, 2, 3, 7, 8, 20])

    def scores(shift):
        positions = (pos + shift)[None].expand(1, -1)  # the [batch, seq] form
        return apply_rope(q, positions) @ apply_rope(k, positions).transpose(-2, -1)

    base = scores(0)
    for shift in (1, 5, 33):
        torch.testing.assert_close(scores(shift), base, atol=1e-5, rtol=1e-5)
    unrotated = q @ k.transpose(-2, -1)
    assert (base - unrotated).abs().max() > 1e-2  # the rotation did something


def test_rope_rejects_odd_dims_and_misshaped_positions():
    with pytest.raises(InputError, match="d even"):
        apply_rope(torch.randn(1, 1, 3, 5), torch.arange(3))
    with pytest.raises(InputError, match="seq=3"):
        apply_rope(torch.randn(1, 1, 3, 4), torch.arange(4))


# ----------------------------------------------------------------------------- ALiBi
def test_alibi_slopes_for_eight_heads_are_powers_of_one_half():
    want = torch.tensor([2.0 ** -(i + 1) for i in range(8)])
    torch.testing.assert_close(alibi_slopes(8), want, atol=0, rtol=0)


@pytest.mark.parametrize("n_heads", [1, 4, 6, 12])
def test_alibi_slopes_follow_press_et_al(n_heads):
    def geometric(n):  # start = ratio = 2^(-8/n)
        start = 2 ** (-8 / n)
        return [start * start**i for i in range(n)]

    p = 2 ** int(math.log2(n_heads))
    want = geometric(p) + geometric(2 * p)[0::2][: n_heads - p]
    torch.testing.assert_close(alibi_slopes(n_heads), torch.tensor(want), atol=1e-7, rtol=0)


def test_alibi_bias_is_linear_in_distance_with_the_head_slopes():
    slopes = alibi_slopes(8)
    bias = alibi_bias(slopes, 5, 7)
    assert bias.shape == (8, 5, 7)
    for h in range(8):
        for i in range(5):
            for j in range(7):
                assert float(bias[h, i, j]) == pytest.approx(-(2.0 ** -(h + 1)) * abs(i - j))
    # below the diagonal, key j is one step further from the query than key j + 1:
    # it costs exactly one more slope
    steps = bias[:, :, 1:] - bias[:, :, :-1]  # [head, query, key - 1]
    below = torch.ones(5, 6, dtype=torch.bool).tril(-1)
    torch.testing.assert_close(steps[:, below], slopes[:, None].expand(8, int(below.sum())))


# ---------------------------------------------------- symmetry of attention modules
def _permuted_outputs(attn, x, perm, table=None):
    """Run attn on x and on x[perm]; return (out, pattern, out_p, pattern_p)."""
    store = []
    handle = attn.hook_pattern.register_forward_hook(lambda m, i, o: store.append(o.clone()))
    try:
        results = []
        for inputs in (x, x[:, perm]):
            if table is not None:  # positions are added after the permutation
                inputs = inputs + table
            results.append(attn(inputs))
    finally:
        handle.remove()
    return results[0], store[0], results[1], store[1]


@pytest.mark.parametrize("scheme", ["none", "sinusoidal", "rope", "alibi"])
def test_self_attention_is_permutation_equivariant_only_without_positions(scheme):
    d, seq = 16, 6
    attn = PositionalAttention(d, 4, rope=scheme == "rope", alibi=scheme == "alibi").eval()
    table = sinusoidal_table(seq, d) if scheme == "sinusoidal" else None
    x = torch.randn(1, seq, d)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    with torch.no_grad():
        out, pattern, out_p, pattern_p = _permuted_outputs(attn, x, perm, table)
    permuted_pattern = pattern[:, :, perm][:, :, :, perm]  # rows and columns
    if scheme == "none":
        torch.testing.assert_close(out_p, out[:, perm], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(pattern_p, permuted_pattern, atol=1e-6, rtol=1e-5)
    else:
        assert (out_p - out[:, perm]).abs().max() > 1e-3
        assert (pattern_p - permuted_pattern).abs().max() > 1e-3


def test_nopos_model_is_permutation_equivariant_and_the_others_are_not():
    ids = torch.tensor([[2, 40, 77, 120, 9, 301, 55]])
    perm = torch.tensor([6, 2, 0, 4, 1, 5, 3])
    for name in NAMES:
        model, _ = build_reference(name)
        track(model)
        with torch.no_grad(), attnprobe.capture(model) as cap:
            logits, logits_p = model(ids), model(ids[:, perm])
        pattern, pattern_p = cap.maps[0].pattern, cap.maps[1].pattern  # [layer, head, q, k]
        moved = pattern[:, :, perm][:, :, :, perm]
        if name == "nopos":
            torch.testing.assert_close(logits_p, logits[:, perm], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(pattern_p, moved, atol=1e-6, rtol=1e-5)
        else:
            assert (logits_p - logits[:, perm]).abs().max() > 1e-3, name
            assert (pattern_p - moved).abs().max() > 1e-3, name


# --------------------------------------------------------------------- the models
@pytest.mark.parametrize("name", NAMES)
def test_capture_strips_padding_and_matches_each_text_alone(name):
    model, tok = build_reference(name)
    track(model)
    assert model.attnprobe_name == name
    assert model.config.causal is (name == "alibi")
    views = []
    for side in ("left", "right"):
        batch = tok(TEXTS, padding_side=side)
        with torch.no_grad(), attnprobe.capture(model, scores=True) as cap:
            model(**batch)
        views.append(cap.maps)
    alone = []
    for text in TEXTS:
        with torch.no_grad(), attnprobe.capture(model) as cap:
            model(**tok([text]))
        alone.extend(cap.maps)
    for left, right, single, text in zip(*views, alone, TEXTS, strict=True):
        n = len(tok.encode(text))
        assert left.kind == "self" and left.stack == "blocks"
        assert left.pattern.shape == (2, 4, n, n)
        assert left.scores is not None and left.scores.shape == left.pattern.shape
        upper = torch.ones(n, n, dtype=torch.bool).triu(1)
        for other in (right, single):
            torch.testing.assert_close(other.pattern, left.pattern, atol=1e-6, rtol=1e-5)
        future_weight = left.pattern[..., upper].abs().max()
        assert (future_weight == 0) if name == "alibi" else (future_weight > 0)


def test_alibi_scores_are_raw_scores_plus_the_bias():
    model, tok = build_reference("alibi")
    track(model)
    batch = tok(["the cat sat on the mat"])
    with torch.no_grad(), attnprobe.capture(model, layers=[0], scores=True) as cap:
        model(**batch)
        attn = model.blocks[0].attn
        x = model.blocks[0].ln1(model.embed(batch["input_ids"]))  # layer 0 input
        q = attn.q_proj(x).view(1, -1, 4, 8).transpose(1, 2)  # [batch, head, seq, d_head]
        k = attn.k_proj(x).view(1, -1, 4, 8).transpose(1, 2)
        raw = (q @ k.transpose(-2, -1) / math.sqrt(8))[0]  # [head, q, k]
    seq = raw.shape[-1]
    dist = (torch.arange(seq)[:, None] - torch.arange(seq)[None]).abs()
    want_bias = -torch.tensor([2.0 ** -(2 * (h + 1)) for h in range(4)])[:, None, None] * dist
    got = cap.maps[0].scores[0]  # [head, q, k] of layer 0
    torch.testing.assert_close(got - raw, want_bias, atol=1e-5, rtol=0)
    future = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    torch.testing.assert_close(cap.maps[0].pattern[0],
                               got.masked_fill(future, float("-inf")).softmax(-1))


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_editing_the_pattern_changes_the_logits(name):
    model, tok = build_reference(name)
    batch = tok(["The cat sat on the mat."])
    point = model.get_submodule("blocks.1.attn.hook_pattern")
    with torch.no_grad():
        clean = model(**batch)
        handle = point.register_forward_hook(lambda m, i, o: torch.full_like(o, 1 / o.shape[-1]))
        try:
            edited = model(**batch)
        finally:
            handle.remove()
    assert (edited - clean).abs().max() > 1e-3


def test_bad_configs_raise_input_errors():
    with pytest.raises(InputError, match="'learned'"):
        PositionalConfig(vocab_size=10, positional="learned")
    with pytest.raises(InputError, match="d_head=3"):
        PositionalAttention(12, 4, rope=True)
    with pytest.raises(InputError, match="max_len is 64"):
        build_reference("rope")[0](torch.ones(1, 65, dtype=torch.long))
