"""Sparse attention: masks against independently written double loops, the BigBird pattern's
structure and reproducibility, captured patterns of the sliding-window and BigBird models, and
input errors."""

from __future__ import annotations

import pytest
import torch

import attnprobe
import attnprobe.models.sparse as sparse
from attnprobe.errors import InputError
from attnprobe.models.attention import MultiHeadAttention
from attnprobe.models.zoo import REFERENCE_MODELS, build_reference
from tests.conftest import track

TEXTS = ["The cat sat on the mat by the door.", "A big dog ran."]  # 11 and 6 tokens


def loop_window(n: int, w: int, causal: bool) -> torch.Tensor:
    out = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            out[i, j] = (0 <= i - j <= w) if causal else abs(i - j) <= w
    return out


def loop_global(n: int, idx: list[int]) -> torch.Tensor:
    out = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            out[i, j] = i in idx or j in idx
    return out


def loop_bigbird_base(n: int, block: int, window_blocks: int, n_global: int) -> torch.Tensor:
    """Window + global part of BigBird, token by token."""
    out = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            r, c = i // block, j // block
            out[i, j] = abs(r - c) <= window_blocks or r < n_global or c < n_global
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n", "w"), [(1, 0), (1, 1), (5, 0), (6, 1), (7, 3), (5, 4), (5, 5)])
def test_sliding_window_mask_has_exactly_the_band(n, w, causal):
    assert torch.equal(sparse.sliding_window_mask(n, w, causal=causal), loop_window(n, w, causal))


@pytest.mark.parametrize("idx", [[0], [2, 5], [0, 6], []])
def test_global_tokens_mask_has_exactly_global_rows_and_columns(idx):
    assert torch.equal(sparse.global_tokens_mask(7, idx), loop_global(7, idx))


@pytest.mark.parametrize(("n", "block", "wb", "g"), [(12, 3, 1, 1), (16, 2, 2, 2), (8, 4, 0, 0)])
def test_bigbird_without_random_blocks_is_window_plus_global_and_symmetric(n, block, wb, g):
    mask = sparse.bigbird_mask(n, block, 0, wb, g, torch.Generator().manual_seed(0))
    assert torch.equal(mask, loop_bigbird_base(n, block, wb, g))
    assert torch.equal(mask, mask.T)  # window and global parts are symmetric in the paper


def test_bigbird_random_blocks_are_whole_blocks_outside_window_and_global():
    n, block, n_random, wb, g = 40, 4, 2, 1, 1
    n_blocks = n // block
    mask = sparse.bigbird_mask(n, block, n_random, wb, g, torch.Generator().manual_seed(3))
    base = loop_bigbird_base(n, block, wb, g)
    assert bool((mask | base).eq(mask).all())  # contains window + global
    extra = mask & ~base  # the random part
    blocks = extra.view(n_blocks, block, n_blocks, block)
    # constant within each block: whole blocks are chosen
    assert bool((blocks == blocks[:, :1, :, :1]).all())
    per_row = blocks[:, 0, :, 0].sum(dim=1)  # random key blocks per query block
    assert per_row[:g].tolist() == [0] * g  # global query blocks draw none
    assert per_row[g:].tolist() == [n_random] * (n_blocks - g)
    assert not torch.equal(mask, mask.T)  # the random part is not symmetric


def test_bigbird_takes_every_free_block_when_fewer_than_n_random_remain():
    mask = sparse.bigbird_mask(8, 2, 5, 1, 1, torch.Generator().manual_seed(0))
    assert bool(mask.all())  # 4 blocks: window + global + up to 5 random covers all


def test_bigbird_is_reproducible_with_a_seed_and_differs_with_another():
    def make(seed):
        return sparse.bigbird_mask(64, 4, 2, 1, 1, torch.Generator().manual_seed(seed))

    assert torch.equal(make(7), make(7))
    assert not torch.equal(make(7), make(8))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: sparse.sliding_window_mask(4, 5), "larger than the sequence"),
        (lambda: sparse.sliding_window_mask(4, -1), "non-negative"),
        (lambda: sparse.sliding_window_mask(0, 0), "length"),
        (lambda: sparse.global_tokens_mask(4, [4]), r"\[0, 4\)"),
        (lambda: sparse.bigbird_mask(10, 3, 1, 1, 1), "divide"),
        (lambda: sparse.bigbird_mask(10, 0, 1, 1, 1), "divide"),
        (lambda: sparse.bigbird_mask(8, 2, -1, 1, 1), "n_random"),
        (lambda: sparse.bigbird_mask(8, 2, 1, 5, 1), "window_blocks=5"),
        (lambda: sparse.bigbird_mask(8, 2, 1, 1, 5), "n_global_blocks=5"),
        (lambda: sparse.SlidingWindowAttention(8, 2, -2), "window"),
        (lambda: sparse.BigBirdAttention(8, 2, block=0, n_random=1, window_blocks=1,
                                         n_global_blocks=1), "block"),
        (lambda: sparse.SparseConfig(vocab_size=10, pattern="bigbird", causal=True), "causal"),
    ],
)
def test_bad_sizes_raise_input_error(call, match):
    with pytest.raises(InputError, match=match):
        call()


def test_sliding_window_covering_the_sequence_equals_full_attention():
    n = 6
    full = MultiHeadAttention(16, 2)
    x = torch.randn(2, n, 16)
    for w in (n - 1, n, 50):  # a window longer than the input is clipped to it
        layer = sparse.SlidingWindowAttention(16, 2, w)
        layer.load_state_dict(full.state_dict())
        torch.testing.assert_close(layer(x), full(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_sliding_window_output_ignores_tokens_outside_the_window(causal):
    n, w = 9, 2
    layer = sparse.SlidingWindowAttention(16, 2, w, causal=causal)
    x = torch.randn(1, n, 16)
    base = layer(x)
    for j in range(n):
        moved = x.clone()
        moved[0, j] += 5.0
        changed = (layer(moved) - base).abs().amax(dim=-1)[0] > 1e-6  # [query]
        assert torch.equal(changed, loop_window(n, w, causal)[:, j])


def _capture(model, tok, texts=TEXTS, padding_side="right"):
    batch = tok(texts, padding_side=padding_side)
    with attnprobe.capture(track(model), scores=True) as cap:
        model(**batch)
    return cap.maps


def test_registry_holds_sliding_window_and_sparse():
    assert {"sliding-window", "sparse"} <= set(REFERENCE_MODELS.names())
    model, tok = build_reference("sliding-window")
    assert model.attnprobe_name == "sliding-window" and not model.training
    assert (model.config.n_layers, model.config.n_heads, model.config.causal) == (2, 4, False)
    assert model.config.vocab_size == len(tok)
    assert isinstance(model.get_submodule("blocks.1.attn"), sparse.SlidingWindowAttention)
    bird, _ = build_reference("sparse")
    assert isinstance(bird.get_submodule("blocks.1.attn"), sparse.BigBirdAttention)
    assert bird.config.causal is False
    other, _ = build_reference("sparse", seed=1)
    assert not torch.equal(bird.blocks[0].attn.pattern(64), other.blocks[0].attn.pattern(64))


def test_sliding_window_model_capture_is_zero_outside_the_band():
    model, tok = build_reference("sliding-window")
    maps = _capture(model, tok)
    lengths = [len(tok.encode(t)) for t in TEXTS]  # [BOS] + tokens, padding stripped
    assert [tuple(m.pattern.shape) for m in maps] == [(2, 4, n, n) for n in lengths]
    for m in maps:
        n = m.pattern.shape[-1]
        assert m.kind == "self" and m.info.causal is False
        band = loop_window(n, 2, causal=False)  # the model's window is 2
        assert bool((m.pattern[..., ~band] == 0).all())
        assert bool((m.pattern[..., band] > 0).all())
        torch.testing.assert_close(m.pattern.sum(-1), torch.ones(2, 4, n))
        assert m.scores is not None and m.scores.shape == m.pattern.shape


def test_sparse_model_capture_follows_its_bigbird_pattern():
    model, tok = build_reference("sparse")
    maps = _capture(model, tok)
    lengths = [len(tok.encode(t)) for t in TEXTS]  # [BOS] + tokens, padding stripped
    assert [tuple(m.pattern.shape) for m in maps] == [(2, 4, n, n) for n in lengths]
    for m in maps:
        n = m.pattern.shape[-1]
        for layer in range(2):
            allowed = model.blocks[layer].attn.pattern(n)
            padded = -(-n // 2) * 2  # the pattern of the next multiple of the block, cut
            base = loop_bigbird_base(padded, 2, 1, 1)[:n, :n]
            assert bool((allowed | base).eq(allowed).all())
            assert bool((m.pattern[layer][..., ~allowed] == 0).all())
            assert bool((m.pattern[layer][..., allowed] > 0).all())
        torch.testing.assert_close(m.pattern.sum(-1), torch.ones(2, 4, n))


@pytest.mark.parametrize("name", ["sliding-window", "sparse"])
def test_patterns_do_not_depend_on_the_padding_side(name):
    model, tok = build_reference(name)
    right = _capture(model, tok, padding_side="right")
    left = _capture(model, tok, padding_side="left")
    for a, b in zip(right, left, strict=True):
        torch.testing.assert_close(a.pattern, b.pattern, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["sliding-window", "sparse"])
def test_an_edit_through_capture_changes_the_output(name):
    model, tok = build_reference(name)
    batch = tok(TEXTS)
    before = model(**batch)

    def to_self(layer, pattern):
        eye = torch.eye(pattern.shape[-1], dtype=pattern.dtype)
        return eye.expand_as(pattern)

    with attnprobe.capture(track(model), edit=to_self):
        after = model(**batch)
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(model(**batch), before)  # hooks gone, output restored


def test_pattern_attention_rejects_a_context_and_a_bad_padding_mask():
    layer = sparse.SlidingWindowAttention(8, 2, 1)
    x = torch.randn(2, 5, 8)
    with pytest.raises(InputError, match="self-attention"):
        layer(x, x)
    with pytest.raises(InputError, match="key_padding_mask"):
        layer(x, key_padding_mask=torch.ones(2, 4))


def test_bigbird_pattern_of_an_example_does_not_depend_on_its_batch():
    import attnprobe as ap
    from tests.conftest import track

    model, tok = ap.load_model("ref:sparse")
    model = track(model)
    short = "the cat sat on the mat and the dog ran home"
    long = " ".join(["the cat sat on the mat"] * 4)
    with ap.capture(model, tokenizer=tok) as alone:
        model(**tok([short]))
    with ap.capture(model, tokenizer=tok) as batched:
        model(**tok([short, long]))
    assert torch.equal(alone.maps[0].pattern > 0, batched.maps[0].pattern > 0)
    assert torch.allclose(alone.maps[0].pattern, batched.maps[0].pattern, atol=1e-6)
