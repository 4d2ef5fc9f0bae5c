"""ScaledDotProductAttention and MultiHeadAttention against values known by construction and
against torch's own implementations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnprobe.errors import InputError
from attnprobe.models import MultiHeadAttention, ScaledDotProductAttention


def _qkv(batch=2, heads=3, n_query=5, n_key=6, d=8, dv=4, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n_query, d, generator=g, dtype=dtype)
    k = torch.randn(batch, heads, n_key, d, generator=g, dtype=dtype)
    v = torch.randn(batch, heads, n_key, dv, generator=g, dtype=dtype)
    return q, k, v


def _random_mask(batch, n_query, n_key, seed=1):
    """Bool [batch, 1, query, key] mask where every row keeps at least one key."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, 1, n_query, n_key, generator=g) > 0.5
    mask[..., 0] = True
    return mask


def _record(hook_point):
    """Register a forward hook that stores outputs; returns (store, handle)."""
    store: list[torch.Tensor] = []
    handle = hook_point.register_forward_hook(lambda m, i, o: store.append(o.detach().clone()))
    return store, handle


def test_pattern_rows_sum_to_one_and_masked_keys_get_zero():
    q, k, v = _qkv()
    mask = _random_mask(2, 5, 6)
    sdpa = ScaledDotProductAttention()
    store, handle = _record(sdpa.hook_pattern)
    try:
        sdpa(q, k, v, mask)
    finally:
        handle.remove()
    (pattern,) = store
    assert pattern.shape == (2, 3, 5, 6)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 3, 5), atol=1e-6, rtol=0)
    assert (pattern.masked_select(~mask.expand_as(pattern)) == 0).all()


def test_zero_query_gives_uniform_weights_over_allowed_keys():
    _, k, v = _qkv(batch=1, heads=1, n_query=2, n_key=4)
    q = torch.zeros(1, 1, 2, 8)
    mask = torch.tensor([[True, True, True, True], [True, False, True, False]])  # [query, key]
    sdpa = ScaledDotProductAttention()
    store, handle = _record(sdpa.hook_pattern)
    try:
        out = sdpa(q, k, v, mask)
    finally:
        handle.remove()
    expected = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.5, 0.0, 0.5, 0.0]])
    torch.testing.assert_close(store[0][0, 0], expected, atol=1e-7, rtol=0)
    torch.testing.assert_close(out[0, 0, 0], v[0, 0].mean(0), atol=1e-6, rtol=0)
    torch.testing.assert_close(out[0, 0, 1], v[0, 0, [0, 2]].mean(0), atol=1e-6, rtol=0)


def test_causal_pattern_is_lower_triangular():
    q, k, v = _qkv(n_query=5, n_key=5)
    sdpa = ScaledDotProductAttention()
    store, handle = _record(sdpa.hook_pattern)
    try:
        sdpa(q, k, v, causal=True)
    finally:
        handle.remove()
    (pattern,) = store
    upper = torch.ones(5, 5, dtype=torch.bool).triu(diagonal=1)
    assert (pattern[..., upper] == 0).all()
    assert (pattern[..., ~upper] > 0).all()
    assert (pattern[..., 0, 0] == 1).all()  # the first query can only see itself


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["none", "mask", "causal", "mask+causal", "rectangular"])
def test_matches_torch_scaled_dot_product_attention(case, dtype):
    n_key = 7 if case == "rectangular" else 5
    q, k, v = _qkv(n_query=5, n_key=n_key, dtype=dtype)
    mask = _random_mask(2, 5, n_key) if "mask" in case or case == "rectangular" else None
    causal = "causal" in case
    ours = ScaledDotProductAttention()(q, k, v, mask, causal=causal)
    if mask is not None and causal:
        ref_mask = mask & torch.ones(5, n_key, dtype=torch.bool).tril()
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=ref_mask)
    else:
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)


def test_hook_scores_sees_scaled_unmasked_scores():
    q, k, v = _qkv()
    mask = _random_mask(2, 5, 6)
    sdpa = ScaledDotProductAttention()
    store, handle = _record(sdpa.hook_scores)
    try:
        sdpa(q, k, v, mask)
    finally:
        handle.remove()
    torch.testing.assert_close(store[0], q @ k.transpose(-2, -1) / 8**0.5)


def test_pattern_hook_can_replace_the_weights():
    q, k, v = _qkv(n_query=3, n_key=4)
    sdpa = ScaledDotProductAttention()
    one_hot = torch.zeros(2, 3, 3, 4)
    one_hot[..., 2] = 1.0  # every query looks only at key 2
    handle = sdpa.hook_pattern.register_forward_hook(lambda m, i, o: one_hot)
    try:
        out = sdpa(q, k, v)
    finally:
        handle.remove()
    torch.testing.assert_close(out, v[:, :, 2:3].expand(-1, -1, 3, -1))


def test_fully_masked_row_raises_one_line_error():
    q, k, v = _qkv(n_query=3, n_key=4)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    with pytest.raises(InputError, match="fully masked query row") as info:
        ScaledDotProductAttention()(q, k, v, mask)
    assert "\n" not in str(info.value)


def test_bad_masks_and_shapes_raise():
    q, k, v = _qkv(n_query=3, n_key=4)
    sdpa = ScaledDotProductAttention()
    with pytest.raises(InputError, match="bool"):
        sdpa(q, k, v, torch.ones(3, 4))
    with pytest.raises(InputError, match="broadcast"):
        sdpa(q, k, v, torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(InputError, match="4-d"):
        sdpa(q[0], k[0], v[0])


def _copy_into_torch_mha(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(ours.d_model, ours.n_heads, bias=True, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(
            torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight])
        )
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ref.eval()


@pytest.mark.parametrize("causal", [False, True])
def test_mha_matches_torch_multihead_attention(causal):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    ref = _copy_into_torch_mha(mha)
    x = torch.randn(2, 5, 16)
    padding = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    store, handle = _record(mha.hook_pattern)
    try:
        out = mha(x, key_padding_mask=padding, causal=causal)
    finally:
        handle.remove()
    blocked = torch.ones(5, 5, dtype=torch.bool).triu(1) if causal else None
    ref_out, ref_pattern = ref(
        x, x, x, key_padding_mask=padding == 0, attn_mask=blocked, average_attn_weights=False
    )
    real = padding.bool()  # padding query rows differ on purpose (ours: attend to self)
    torch.testing.assert_close(out[real], ref_out[real], atol=1e-6, rtol=0)
    ours_pattern = store[0].transpose(1, 2)  # [batch, query, head, key]
    ref_pattern = ref_pattern.transpose(1, 2)
    torch.testing.assert_close(ours_pattern[real], ref_pattern[real], atol=1e-6, rtol=0)


def test_gqa_equals_explicitly_repeated_kv_heads():
    torch.manual_seed(0)
    gqa = MultiHeadAttention(16, 4, n_kv_heads=2)
    full = MultiHeadAttention(16, 4)
    assert gqa.k_proj.out_features == 8 and full.k_proj.out_features == 16

    def repeat(weight: torch.Tensor) -> torch.Tensor:  # [kv_head * d_head, ...] -> [head * ...]
        per_head = weight.reshape(2, 4, *weight.shape[1:])  # [kv_head, d_head, ...]
        return per_head.repeat_interleave(2, dim=0).reshape(16, *weight.shape[1:])

    with torch.no_grad():
        full.q_proj.load_state_dict(gqa.q_proj.state_dict())
        full.out_proj.load_state_dict(gqa.out_proj.state_dict())
        for name in ("k_proj", "v_proj"):
            src, dst = getattr(gqa, name), getattr(full, name)
            dst.weight.copy_(repeat(src.weight))
            dst.bias.copy_(repeat(src.bias))
    x = torch.randn(2, 6, 16)
    padding = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])
    torch.testing.assert_close(
        gqa(x, key_padding_mask=padding, causal=True),
        full(x, key_padding_mask=padding, causal=True),
        atol=1e-6,
        rtol=0,
    )


def test_cross_attention_ignores_padded_context():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2)
    x = torch.randn(1, 3, 16)
    context = torch.randn(1, 4, 16)
    padded = torch.cat([context, torch.randn(1, 2, 16)], dim=1)  # 2 junk keys at the end
    store, handle = _record(mha.hook_pattern)
    try:
        out = mha(x, context)
        out_padded = mha(x, padded, torch.tensor([[1, 1, 1, 1, 0, 0]]))
    finally:
        handle.remove()
    assert out.shape == (1, 3, 16)
    assert store[0].shape == (1, 2, 3, 4) and store[1].shape == (1, 2, 3, 6)
    torch.testing.assert_close(out_padded, out, atol=1e-6, rtol=0)
    assert (store[1][..., 4:] == 0).all()


def test_mha_rejects_bad_config_and_inputs():
    with pytest.raises(InputError, match="divisible by n_heads"):
        MultiHeadAttention(10, 4)
    with pytest.raises(InputError, match="n_kv_heads"):
        MultiHeadAttention(16, 4, n_kv_heads=3)
    mha = MultiHeadAttention(16, 4)
    with pytest.raises(InputError, match="key_padding_mask"):
        mha(torch.randn(2, 5, 16), key_padding_mask=torch.ones(2, 4))
    with pytest.raises(InputError, match="x must be"):
        mha(torch.randn(2, 5, 8))


def test_padding_queries_attend_to_themselves_so_no_row_is_empty():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2)
    x = torch.randn(1, 4, 16)
    left_padded = torch.tensor([[0, 0, 1, 1]])
    store, handle = _record(mha.hook_pattern)
    try:
        out = mha(x, key_padding_mask=left_padded, causal=True)
    finally:
        handle.remove()
    (pattern,) = store  # [batch, head, query, key]
    assert torch.isfinite(out).all()
    torch.testing.assert_close(pattern[0, :, 0], torch.tensor([[1.0, 0, 0, 0]] * 2))
    torch.testing.assert_close(pattern[0, :, 1], torch.tensor([[0, 1.0, 0, 0]] * 2))
    assert (pattern[0, :, 2:, :2] == 0).all()  # real queries never see padding keys
    torch.testing.assert_close(pattern[0, :, 2, 2], torch.ones(2))  # first real token: itself


def test_mha_real_query_with_no_key_raises():
    mha = MultiHeadAttention(16, 2)
    blocked = torch.ones(3, 3, dtype=torch.bool)
    blocked[2] = False
    with pytest.raises(InputError, match="fully masked query row"):
        mha(torch.randn(1, 3, 16), attn_mask=blocked)
    with pytest.raises(InputError, match="bool"):
        mha(torch.randn(1, 3, 16), attn_mask=torch.ones(3, 3))
