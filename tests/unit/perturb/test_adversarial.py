"""Adversarial attention (Jain & Wallace §5.3) on tiny models with known answers."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import attnprobe as ap
from attnprobe.perturb.adversarial import (
    ADVERSARIAL_COLUMNS,
    AdversarialResult,
    adversarial_attention,
)
from tests.conftest import track

LN2 = math.log(2)


class OneHead(nn.Module):
    """One head whose weights are peaked on key 0 (softmax of a +8 score), then a 2-class
    readout of the mean head output. ``flat=True``: every key has the same value vector, so
    the weights cannot change the output; ``flat=False``: keys alternate between two classes,
    so the output follows the weights."""

    def __init__(self, *, flat: bool) -> None:
        super().__init__()
        self.flat = flat
        self.hook_pattern = ap.HookPoint()

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, n = input_ids.shape
        scores = torch.zeros(batch, 1, n, n)
        scores[..., 0] = 8.0
        pattern = self.hook_pattern(scores.softmax(-1))  # [batch, 1, n, n]
        if self.flat:
            values = torch.tensor([1.0, -1.0]).expand(batch, 1, n, 2)
        else:
            values = 3 * nn.functional.one_hot(torch.arange(n) % 2, 2).float()
            values = values.expand(batch, 1, n, 2)
        return (pattern @ values).mean(2)[:, 0]  # logits [batch, 2]


def probs(output: torch.Tensor) -> torch.Tensor:
    return output.softmax(-1)


def one_example(n: int = 5) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.zeros(1, n, dtype=torch.long)}


def test_attention_that_cannot_matter_is_replaced_by_a_near_disjoint_one():
    model = track(OneHead(flat=True))
    result = adversarial_attention(model, one_example(), layer=0, heads=[0], output_fn=probs,
                                   eps=0.01, steps=150)
    assert isinstance(result, AdversarialResult)
    assert len(result.jsd) == len(result.tvd) == 5
    assert max(result.tvd) < 1e-6  # identical values: the output cannot move
    assert result.n_within_eps == 5
    # the original puts 0.9987 on key 0, so JSD can approach (but not exceed) ln 2
    assert 0.65 < result.max_jsd_within_eps <= LN2
    assert result.max_jsd_within_eps == max(result.jsd)
    assert all(0 <= j <= LN2 for j in result.jsd)
    assert result.original.shape == (1, 5, 5)
    assert result.attention.shape == (5, 1, 5, 5)
    torch.testing.assert_close(result.attention.sum(-1), torch.ones(5, 1, 5))


def test_no_adversary_within_eps_reports_none_and_says_so():
    model = track(OneHead(flat=False))
    result = adversarial_attention(model, one_example(), layer=0, heads=[0], output_fn=probs,
                                   eps=1e-9, steps=2)
    assert result.max_jsd_within_eps is None
    assert result.n_within_eps == 0
    assert "no adversary" in result.note
    frame = result.to_frame()
    assert not frame["within_eps"].any()
    assert frame[["jsd", "tvd"]].notna().all().all()


def test_classifier_result_is_consistent_and_model_is_untouched():
    model, tok = ap.load_model("ref:transformer-classifier")
    track(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = dict(tok(["the cat sat on the mat"]))
    result = adversarial_attention(model, inputs, layer=1, heads=[0, 1], output_fn=probs,
                                   eps=0.05, n_adversaries=3, steps=40)
    n = int(inputs["attention_mask"].sum())
    assert result.attention.shape == (3, 2, n, n)
    assert result.original.shape == (2, n, n)
    frame = result.to_frame()
    assert tuple(frame.columns) == ADVERSARIAL_COLUMNS
    assert len(frame) == 3 and (frame["heads"] == "L1H0,L1H1").all()
    within = frame.loc[frame["tvd"] <= 0.05, "jsd"]
    if len(within):
        assert result.max_jsd_within_eps == pytest.approx(within.max())
    else:
        assert result.max_jsd_within_eps is None
    # the original weights are the model's own
    with ap.capture(model, layers=[1]) as cap, torch.no_grad():
        model(**inputs)
    torch.testing.assert_close(result.original, cap.maps[0].pattern[0])
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])
    assert all(p.grad is None for p in model.parameters())
    assert not model.training


def test_masked_keys_keep_zero_weight_on_a_causal_model():
    model, tok = ap.load_model("ref:transformer")
    track(model)
    inputs = dict(tok(["one two three four"]))

    def next_token(output: torch.Tensor) -> torch.Tensor:
        return output[:, -1].softmax(-1)

    result = adversarial_attention(model, inputs, layer=0, heads=[3], output_fn=next_token,
                                   eps=0.05, n_adversaries=2, steps=5)
    upper = torch.ones(result.attention.shape[-2:], dtype=torch.bool).triu(1)
    assert (result.attention[..., upper] == 0).all()
    assert (result.attention[..., 0, 0] == 1).all()  # first query has one key: unchanged


def test_same_seed_same_result():
    model = track(OneHead(flat=False))
    kwargs = {"layer": 0, "heads": [0], "output_fn": probs, "eps": 0.05, "steps": 5,
              "n_adversaries": 2}
    first = adversarial_attention(model, one_example(), seed=3, **kwargs)
    again = adversarial_attention(model, one_example(), seed=3, **kwargs)
    assert first.jsd == again.jsd and first.tvd == again.tvd


@pytest.mark.parametrize("eps", [0, -0.1, float("nan")])
def test_eps_must_be_positive(eps):
    model = track(OneHead(flat=True))
    with pytest.raises(ap.InputError, match="eps"):
        adversarial_attention(model, one_example(), layer=0, heads=[0], output_fn=probs,
                              eps=eps)


@pytest.mark.parametrize(("layer", "heads", "match"), [
    (1, [0], "out of range"),
    (0, [1], "out of range"),
    (0, [], "heads"),
    (0, [0, 0], "repeat"),
    (-1, [0], "layer"),
])
def test_bad_scope_raises(layer, heads, match):
    model = track(OneHead(flat=True))
    with pytest.raises(ap.InputError, match=match):
        adversarial_attention(model, one_example(), layer=layer, heads=heads,
                              output_fn=probs, eps=0.01, steps=1)


def test_bad_inputs_and_output_fn_raise():
    model = track(OneHead(flat=True))
    two = {"input_ids": torch.zeros(2, 5, dtype=torch.long)}
    with pytest.raises(ap.InputError, match="one example"):
        adversarial_attention(model, two, layer=0, heads=[0], output_fn=probs, eps=0.01)
    with pytest.raises(ap.InputError, match="probabilities"):
        adversarial_attention(model, one_example(), layer=0, heads=[0],
                              output_fn=lambda out: out, eps=0.01, steps=1)
    with pytest.raises(ap.InputError, match="two keys"):
        adversarial_attention(model, one_example(1), layer=0, heads=[0], output_fn=probs,
                              eps=0.01, steps=1)
