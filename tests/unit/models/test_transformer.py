"""TransformerModel and the reference-model registry: hook paths, padding invariance, the edit
seam and input errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

from attnprobe.errors import InputError, ModelNotFoundError
from attnprobe.models import (
    REFERENCE_MODELS,
    TransformerConfig,
    TransformerModel,
    WordTokenizer,
    build_reference,
)

Tensor = torch.Tensor
NAMES = ["sdpa", "mha", "encoder", "transformer"]
TEXTS = ["The cat sat on the mat.", "A dog ran.", "the quick brown fox jumps over the lazy dog"]


@contextmanager
def recording(model: torch.nn.Module, site: str = "hook_pattern") -> Iterator[dict[int, Tensor]]:
    """Record ``blocks.{i}.attn.<site>`` outputs ``[batch, head, query, key]`` by layer."""
    store: dict[int, torch.Tensor] = {}
    handles = []
    try:
        for i in range(model.n_layers):
            point = model.get_submodule(f"blocks.{i}.attn.{site}")
            handles.append(point.register_forward_hook(_store_into(store, i)))
        yield store
    finally:
        for handle in handles:
            handle.remove()


def _store_into(store: dict[int, torch.Tensor], layer: int) -> Callable:
    def hook(module, inputs, output):
        store[layer] = output.detach().clone()

    return hook


@pytest.fixture(scope="module", params=NAMES)
def built(request) -> tuple[str, TransformerModel, WordTokenizer]:
    model, tok = build_reference(request.param)
    return request.param, model, tok


def test_registry_holds_the_four_models_with_their_shapes():
    assert set(NAMES) <= set(REFERENCE_MODELS.names())
    expected = {  # name: (n_layers, n_heads, n_kv_heads, causal)
        "sdpa": (1, 1, None, False),
        "mha": (1, 4, None, False),
        "encoder": (2, 4, None, False),
        "transformer": (2, 4, 2, True),
    }
    for name, (n_layers, n_heads, n_kv_heads, causal) in expected.items():
        model, tok = build_reference(name)
        assert model.attnprobe_name == name
        assert not model.training
        assert (model.n_layers, model.n_heads) == (n_layers, n_heads)
        assert (model.config.n_layers, model.config.n_heads) == (n_layers, n_heads)
        assert model.config.n_kv_heads == n_kv_heads
        assert model.config.causal is causal
        assert model.config.vocab_size == len(tok)
        model.get_submodule(f"blocks.{n_layers - 1}.attn.hook_pattern")
        model.get_submodule(f"blocks.{n_layers - 1}.attn.hook_scores")
    gqa = build_reference("transformer")[0].get_submodule("blocks.0.attn")
    assert gqa.k_proj.out_features == 2 * gqa.d_head


@pytest.mark.parametrize("name", ["encoder", "transformer"])
def test_layer_one_hook_pattern_resolves(name):
    model, _ = build_reference(name)
    assert type(model.get_submodule("blocks.1.attn.hook_pattern")).__name__ == "HookPoint"


def test_builders_are_deterministic_and_leave_global_rng_alone():
    state = torch.random.get_rng_state()
    a, _ = build_reference("transformer", seed=3)
    b, _ = build_reference("transformer", seed=3)
    c, _ = build_reference("transformer", seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)
    for (key, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), key
    assert not torch.equal(a.embed.weight, c.embed.weight)


def test_unknown_reference_model_names_the_choices():
    with pytest.raises(ModelNotFoundError, match="'transformer'"):
        build_reference("nope")


def test_patterns_are_finite_rows_sum_to_one_and_causal_is_triangular(built):
    _, model, tok = built
    batch = tok(TEXTS, padding_side="left")
    with torch.no_grad(), recording(model) as patterns:
        logits = model(**batch)
    assert logits.shape == (3, batch["input_ids"].shape[1], len(tok))
    assert torch.isfinite(logits).all()
    assert sorted(patterns) == list(range(model.n_layers))
    for pattern in patterns.values():
        assert pattern.shape == (3, model.n_heads, *batch["input_ids"].shape[1:] * 2)
        assert torch.isfinite(pattern).all()
        torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]))
        pad_keys = batch["attention_mask"][:, None, None, :] == 0
        real_queries = batch["attention_mask"][:, None, :, None] == 1
        assert (pattern[(pad_keys & real_queries).expand_as(pattern)] == 0).all()
        upper = torch.ones(pattern.shape[-2:], dtype=torch.bool).triu(1)
        if model.config.causal:
            assert (pattern[..., upper] == 0).all()
        else:
            full = int(batch["attention_mask"].sum(1).argmax())  # the longest: no padding
            assert (pattern[full][..., upper] > 0).all()


def _real_parts(patterns, logits, mask):
    """Per example: ([layer][head, q, k] patterns, [q, vocab] logits) on real tokens only."""
    out = []
    for b in range(mask.shape[0]):
        idx = mask[b].nonzero().flatten()
        maps = [p[b][:, idx][:, :, idx] for _, p in sorted(patterns.items())]
        out.append((maps, logits[b, idx]))
    return out


def test_left_and_right_padding_give_identical_attention_and_logits(built):
    _, model, tok = built
    results = []
    for side in ("left", "right"):
        batch = tok(TEXTS, padding_side=side)
        with torch.no_grad(), recording(model) as patterns:
            logits = model(**batch)
        results.append(_real_parts(patterns, logits, batch["attention_mask"]))
    # the same example alone, without any padding, is the third view
    alone = []
    for text in TEXTS:
        batch = tok([text])
        with torch.no_grad(), recording(model) as patterns:
            logits = model(**batch)
        alone.extend(_real_parts(patterns, logits, batch["attention_mask"]))
    for left, right, single in zip(*results, alone, strict=True):
        for view in (right, single):
            for a, b in zip(left[0], view[0], strict=True):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(left[1], view[1], atol=1e-5, rtol=1e-5)


def test_causal_model_ignores_later_tokens():
    model, tok = build_reference("transformer")
    a = tok(["the cat sat on the mat"])["input_ids"]
    b = a.clone()
    b[0, -1] = tok.convert_tokens_to_ids(["dog"])[0]
    with torch.no_grad():
        la, lb = model(a), model(b)
    torch.testing.assert_close(la[0, :-1], lb[0, :-1], atol=0, rtol=0)
    assert not torch.allclose(la[0, -1], lb[0, -1])


def test_hook_scores_are_consistent_with_the_pattern():
    model, tok = build_reference("transformer")
    batch = tok(["The cat sat."])
    with torch.no_grad(), recording(model, "hook_scores") as scores:
        with recording(model) as patterns:
            model(**batch)
    seq = batch["input_ids"].shape[1]
    future = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    expected = scores[1].masked_fill(future, float("-inf")).softmax(-1)
    torch.testing.assert_close(patterns[1], expected)


def test_pattern_hook_edit_changes_the_logits():
    model, tok = build_reference("encoder")
    batch = tok(["The cat sat on the mat."])
    point = model.get_submodule("blocks.1.attn.hook_pattern")
    with torch.no_grad():
        clean = model(**batch)
        identity = point.register_forward_hook(lambda m, i, o: o.clone())
        try:
            same = model(**batch)
        finally:
            identity.remove()
        uniform = point.register_forward_hook(lambda m, i, o: torch.full_like(o, 1 / o.shape[-1]))
        try:
            edited = model(**batch)
        finally:
            uniform.remove()
        again = model(**batch)
    torch.testing.assert_close(same, clean, atol=0, rtol=0)
    assert (edited - clean).abs().max() > 1e-3
    torch.testing.assert_close(again, clean, atol=0, rtol=0)


def test_fully_masked_example_raises():
    model, tok = build_reference("transformer")
    batch = tok(["The cat sat.", "A dog."])
    batch["attention_mask"][1] = 0
    with pytest.raises(InputError, match=r"fully masked example\(s\) \[1\]") as info:
        model(**batch)
    assert "\n" not in str(info.value)


def test_too_long_input_names_both_lengths():
    model = TransformerModel.decoder_only(vocab_size=10, d_model=8, n_heads=2, max_len=6)
    with pytest.raises(InputError, match=r"7 tokens.*max_len is 6") as info:
        model(torch.zeros(1, 7, dtype=torch.long))
    assert "\n" not in str(info.value)
    assert model(torch.zeros(1, 6, dtype=torch.long)).shape == (1, 6, 10)


def test_bad_ids_and_masks_raise():
    model = TransformerModel.encoder(vocab_size=10, d_model=8, n_heads=2, max_len=8)
    with pytest.raises(InputError, match=r"\[0, 10\)"):
        model(torch.tensor([[1, 10]]))
    with pytest.raises(InputError, match="2-d"):
        model(torch.tensor([1, 2]))
    with pytest.raises(InputError, match="integer"):
        model(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(InputError, match="shape of input_ids"):
        model(torch.tensor([[1, 2]]), torch.ones(1, 3))
    with pytest.raises(InputError, match="only 0 and 1"):
        model(torch.tensor([[1, 2]]), torch.tensor([[1, 2]]))


def test_config_validation_and_named_constructors():
    assert TransformerModel.encoder(10).config.causal is False
    dec = TransformerModel.decoder_only(10, n_layers=3, n_kv_heads=1)
    assert (dec.config.causal, dec.n_layers, dec.config.n_kv_heads) == (True, 3, 1)
    assert TransformerConfig(vocab_size=5).positional == "learned"
    with pytest.raises(InputError, match="positional"):
        TransformerConfig(vocab_size=5, positional="rope")
    with pytest.raises(InputError, match="n_layers"):
        TransformerConfig(vocab_size=5, n_layers=0)
