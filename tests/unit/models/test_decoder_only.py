"""The LLaMA-style decoder: grouped-query / multi-query attention against explicit multi-head
computations, causality, padding invariance with RoPE positions from the mask, and capture."""

from __future__ import annotations

import math

import pytest
import torch

import attnprobe
import attnprobe.models.decoder_only  # registers "llama" and "mqa"
from attnprobe.errors import InputError
from attnprobe.models.attention import MultiHeadAttention
from attnprobe.models.decoder_only import LlamaConfig, RMSNorm
from attnprobe.models.positional import PositionalAttention, apply_rope
from attnprobe.models.zoo import build_reference
from tests.conftest import track

TEXTS = ["The cat sat on the mat.", "A dog ran.", "the quick brown fox jumps over the lazy dog"]
D, H, DH, SEQ = 16, 4, 4, 6


def _explicit_mha(attn: PositionalAttention, x: torch.Tensor, pos: torch.Tensor,
                  kv_of_head) -> torch.Tensor:
    """Causal multi-head attention written out head by head; query head h reads the K/V rows
    ``kv_of_head(h)`` of the key/value projections."""
    heads = []
    for h in range(H):
        rows = slice(h * DH, (h + 1) * DH)
        kv = slice(kv_of_head(h) * DH, (kv_of_head(h) + 1) * DH)
        q = x @ attn.q_proj.weight[rows].T  # [batch, seq, d_head]
        k = x @ attn.k_proj.weight[kv].T
        v = x @ attn.v_proj.weight[kv].T
        q, k = apply_rope(q[:, None], pos)[:, 0], apply_rope(k[:, None], pos)[:, 0]
        scores = q @ k.transpose(-2, -1) / math.sqrt(DH)  # [batch, query, key]
        future = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
        heads.append(scores.masked_fill(future, float("-inf")).softmax(-1) @ v)
    return torch.cat(heads, dim=-1) @ attn.out_proj.weight.T  # [batch, seq, d_model]


def test_gqa_with_as_many_kv_heads_as_heads_is_plain_multi_head_attention():
    attn = PositionalAttention(D, H, H, rope=True, bias=False).eval()
    x, pos = torch.randn(2, SEQ, D), torch.tensor([0, 1, 2, 3, 4, 5])
    with torch.no_grad():
        got = attn(x, pos, causal=True)
        torch.testing.assert_close(got, _explicit_mha(attn, x, pos, lambda h: h),
                                   atol=1e-6, rtol=1e-6)
        # and, where RoPE is the identity (every position 0), attention.py's MultiHeadAttention
        plain = MultiHeadAttention(D, H, bias=False)
        plain.load_state_dict(attn.state_dict())
        torch.testing.assert_close(attn(x, torch.zeros(SEQ), causal=True), plain(x, causal=True),
                                   atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_shared_kv_heads_equal_explicitly_repeated_ones(n_kv_heads):
    shared = PositionalAttention(D, H, n_kv_heads, rope=True, bias=False).eval()
    group = H // n_kv_heads
    x, pos = torch.randn(2, SEQ, D), torch.arange(SEQ)
    with torch.no_grad():
        got = shared(x, pos, causal=True)
        torch.testing.assert_close(got, _explicit_mha(shared, x, pos, lambda h: h // group),
                                   atol=1e-6, rtol=1e-6)
        # a full MHA whose K/V projections hold each shared head's weights once per query head
        full = PositionalAttention(D, H, H, rope=True, bias=False).eval()
        full.q_proj.weight.copy_(shared.q_proj.weight)
        full.out_proj.weight.copy_(shared.out_proj.weight)
        for name in ("k_proj", "v_proj"):
            w = getattr(shared, name).weight.view(n_kv_heads, DH, D)  # [kv_head, d_head, d]
            getattr(full, name).weight.copy_(torch.cat([w[h // group] for h in range(H)]))
        torch.testing.assert_close(full(x, pos, causal=True), got, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name, n_kv_heads", [("llama", 2), ("mqa", 1)])
def test_registered_models_capture_causal_maps_and_ignore_padding(name, n_kv_heads):
    model, tok = build_reference(name)
    track(model)
    config = model.config
    assert model.attnprobe_name == name and config.causal is True
    assert (config.n_heads, config.n_kv_heads) == (4, n_kv_heads)
    attn = model.get_submodule("blocks.1.attn")
    assert attn.k_proj.out_features == n_kv_heads * attn.d_head
    views = []
    for side in ("left", "right"):
        batch = tok(TEXTS, padding_side=side)
        with torch.no_grad(), attnprobe.capture(model, scores=True) as cap:
            logits = model(**batch)
        real = batch["attention_mask"].bool()
        views.append(([logits[b, real[b]] for b in range(len(TEXTS))], cap.maps))
    for b, text in enumerate(TEXTS):
        with torch.no_grad(), attnprobe.capture(model) as cap:
            alone = model(**tok([text]))
        n = len(tok.encode(text))
        upper = torch.ones(n, n, dtype=torch.bool).triu(1)
        for logits, maps in views:
            assert maps[b].kind == "self" and maps[b].pattern.shape == (2, 4, n, n)
            assert maps[b].scores is not None
            assert (maps[b].pattern[..., upper] == 0).all()
            torch.testing.assert_close(maps[b].pattern, cap.maps[0].pattern, atol=1e-6,
                                       rtol=1e-5)
            torch.testing.assert_close(logits[b], alone[0], atol=1e-5, rtol=1e-5)


def test_a_position_ignores_later_tokens():
    model, tok = build_reference("llama")
    a = tok(["the cat sat on the mat"])["input_ids"]
    b = a.clone()
    b[0, 3] = tok.convert_tokens_to_ids(["dog"])[0]
    with torch.no_grad():
        la, lb = model(a), model(b)
    torch.testing.assert_close(la[0, :3], lb[0, :3], atol=0, rtol=0)
    assert ((la[0, 3:] - lb[0, 3:]).abs().amax(-1) > 1e-4).all()


def test_rmsnorm_divides_by_the_root_mean_square():
    norm = RMSNorm(5, eps=0.0)
    x = torch.tensor([[3.0, -4.0, 0.0, 1.0, 2.0]])
    rms = math.sqrt((9 + 16 + 0 + 1 + 4) / 5)
    torch.testing.assert_close(norm(x), x / rms)


def test_heads_not_divisible_by_kv_heads_is_an_input_error():
    with pytest.raises(InputError, match=r"n_heads=6 .* n_kv_heads=4"):
        LlamaConfig(vocab_size=10, d_model=24, n_heads=6, n_kv_heads=4)
    with pytest.raises(InputError, match=r"n_heads=6 .* n_kv_heads=4"):
        PositionalAttention(24, 6, 4, rope=True)
