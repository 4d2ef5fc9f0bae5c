"""Linear attention: the linear path against the formula written out as a double loop, the
explicit weights against the linear path, causality, padding, capture and edits."""

from __future__ import annotations

import pytest
import torch

import attnprobe
import attnprobe.models.linear_attention as lin
from attnprobe.errors import InputError
from attnprobe.models.zoo import REFERENCE_MODELS, build_reference
from tests.conftest import track

TEXTS = ["The cat sat on the mat by the door.", "A big dog ran."]


def phi(x: torch.Tensor) -> torch.Tensor:
    """elu(x) + 1 written out: x + 1 for x > 0, exp(x) otherwise."""
    return torch.where(x > 0, x + 1, torch.exp(x))


def loop_linear(q, k, v, causal: bool) -> torch.Tensor:
    """out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j), one (batch, head, i) at a time."""
    batch, heads, n, _ = q.shape
    out = torch.zeros(batch, heads, n, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(n):
                keys = range(i + 1) if causal else range(n)
                sims = [float(phi(q[b, h, i]) @ phi(k[b, h, j])) for j in keys]
                total = sum(sims)
                for s, j in zip(sims, keys, strict=True):
                    out[b, h, i] += s / total * v[b, h, j].double()
    return out


def _qkv(batch=2, heads=2, n=6, d=4, dv=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, n, d, generator=g),
            torch.randn(batch, heads, n, d, generator=g),
            torch.randn(batch, heads, n, dv, generator=g))


def _weights(layer: lin.LinearAttention, x, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, explicit pattern) of one forward with a recording hook on hook_pattern."""
    store: list[torch.Tensor] = []
    handle = layer.hook_pattern.register_forward_hook(lambda m, i, o: store.append(o.detach()))
    try:
        out = layer(x, key_padding_mask=mask)
    finally:
        handle.remove()
    return out, store[0]


@pytest.mark.parametrize("causal", [False, True])
def test_linear_path_matches_the_formula(causal):
    q, k, v = _qkv()
    got = lin.linear_attention(q, k, v, causal=causal)
    torch.testing.assert_close(got.double(), loop_linear(q, k, v, causal), rtol=0, atol=1e-5)


def test_feature_map_is_elu_plus_one():
    x = torch.linspace(-5, 5, 41)
    torch.testing.assert_close(lin.elu_feature_map(x), phi(x))
    assert bool((lin.elu_feature_map(x) > 0).all())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_explicit_weights_reproduce_the_linear_path(causal, padded):
    layer = lin.LinearAttention(16, 4, causal=causal)
    x = torch.randn(3, 7, 16)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [0] * 2 + [1] * 5]) if padded else None
    assert not layer.materialises
    fast = layer(x, key_padding_mask=mask)
    layer.explicit = True
    slow = layer(x, key_padding_mask=mask)
    torch.testing.assert_close(slow, fast, rtol=0, atol=1e-5)
    assert torch.isfinite(fast).all()
    layer.explicit = False
    hooked, pattern = _weights(layer, x, mask)  # a hook alone switches to the explicit path
    torch.testing.assert_close(hooked, fast, rtol=0, atol=1e-5)
    assert pattern.shape == (3, 4, 7, 7)


@pytest.mark.parametrize("causal", [False, True])
def test_weights_are_non_negative_rows_sum_to_one_and_respect_causality(causal):
    layer = lin.LinearAttention(16, 2, causal=causal)
    _, pattern = _weights(layer, torch.randn(2, 6, 16))
    assert bool((pattern >= 0).all())
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 2, 6))
    later = torch.ones(6, 6, dtype=torch.bool).triu(diagonal=1)
    assert bool((pattern[..., later] == 0).all()) is causal


def test_weights_equal_the_normalised_kernel():
    layer = lin.LinearAttention(8, 2)
    x = torch.randn(1, 5, 8)
    q = layer.q_proj(x).view(1, 5, 2, 4).transpose(1, 2)
    k = layer.k_proj(x).view(1, 5, 2, 4).transpose(1, 2)
    kernel = phi(q) @ phi(k).transpose(-2, -1)
    _, pattern = _weights(layer, x)
    torch.testing.assert_close(pattern, kernel / kernel.sum(-1, keepdim=True))


def test_causal_position_is_independent_of_later_tokens():
    layer = lin.LinearAttention(16, 4, causal=True)
    x = torch.randn(1, 8, 16)
    base = layer(x)
    changed = x.clone()
    changed[:, 5:] = torch.randn(1, 3, 16)
    torch.testing.assert_close(layer(changed)[:, :5], base[:, :5], rtol=0, atol=0)
    assert (layer(changed)[:, 5:] - base[:, 5:]).abs().max() > 1e-3


@pytest.mark.parametrize("causal", [False, True])
def test_padded_keys_get_zero_weight_and_do_not_change_real_outputs(causal):
    layer = lin.LinearAttention(16, 2, causal=causal)
    x = torch.randn(2, 6, 16)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]])
    out, pattern = _weights(layer, x, mask)
    real = mask.bool()
    for b in range(2):
        rows = pattern[b][:, real[b]]  # [head, real query, key]
        assert bool((rows[..., ~real[b]] == 0).all())
        alone = layer(x[b : b + 1, real[b]])  # the example without its padding
        torch.testing.assert_close(layer(x, key_padding_mask=mask)[b, real[b]], alone[0])
        torch.testing.assert_close(out[b, real[b]], alone[0], rtol=0, atol=1e-5)


def test_long_input_runs_on_the_linear_path():
    """8,192 tokens, d_model 64: the linear path never forms the 8192 x 8192 matrix."""
    for causal in (False, True):
        layer = lin.LinearAttention(64, 4, causal=causal)
        with torch.no_grad():
            out = layer(torch.randn(1, 8192, 64))
        assert out.shape == (1, 8192, 64) and bool(torch.isfinite(out).all())


def test_unhooked_forward_never_takes_the_explicit_path(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("explicit path used without hooks")

    monkeypatch.setattr(lin, "explicit_linear_attention", forbidden)
    model, tok = build_reference("linear")
    model(**tok(TEXTS))


def test_registry_holds_linear():
    assert "linear" in REFERENCE_MODELS.names()
    model, _ = build_reference("linear")
    assert model.attnprobe_name == "linear" and not model.training
    assert (model.config.n_layers, model.config.n_heads, model.config.causal) == (2, 4, True)
    assert isinstance(model.get_submodule("blocks.1.attn"), lin.LinearAttention)
    assert model.blocks[0].attn.causal


def test_capture_returns_causal_maps_and_leaves_the_output_unchanged():
    model, tok = build_reference("linear")
    batch = tok(TEXTS)
    before = model(**batch)
    with attnprobe.capture(track(model), scores=True) as cap:
        during = model(**batch)
    torch.testing.assert_close(during, before, rtol=0, atol=1e-5)
    lengths = [len(tok.encode(t)) for t in TEXTS]
    assert [tuple(m.pattern.shape) for m in cap.maps] == [(2, 4, n, n) for n in lengths]
    for m in cap.maps:
        n = m.pattern.shape[-1]
        assert m.kind == "self" and m.info.causal is True
        torch.testing.assert_close(m.pattern.sum(-1), torch.ones(2, 4, n))
        later = torch.ones(n, n, dtype=torch.bool).triu(diagonal=1)
        assert bool((m.pattern[..., later] == 0).all())
        assert m.scores is not None and bool((m.scores > 0).all())  # the kernel is positive


def test_an_edit_through_capture_changes_the_output():
    model, tok = build_reference("linear")
    batch = tok(TEXTS)
    before = model(**batch)

    def to_self(layer, pattern):
        return torch.eye(pattern.shape[-1], dtype=pattern.dtype).expand_as(pattern)

    with attnprobe.capture(track(model), edit=to_self):
        after = model(**batch)
    assert (after - before).abs().max() > 1e-3


def test_bad_inputs_raise_input_error():
    with pytest.raises(InputError, match="divisible"):
        lin.LinearAttention(10, 4)
    layer = lin.LinearAttention(8, 2)
    with pytest.raises(InputError, match="x must be"):
        layer(torch.randn(2, 5, 6))
    with pytest.raises(InputError, match="key_padding_mask"):
        layer(torch.randn(2, 5, 8), key_padding_mask=torch.ones(2, 4))
    q, k, v = _qkv()
    with pytest.raises(InputError, match="one shape"):
        lin.linear_attention(q, k[:, :, :3], v)
