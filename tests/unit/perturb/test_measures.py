"""Output and attention change measures against analytic values (methods §0, §13 self-tests)."""

from __future__ import annotations

import math

import pytest
import torch

from attnprobe.errors import InputError
from attnprobe.perturb.measures import (
    attention_jsd,
    cosine_distance,
    decision_flip,
    jsd,
    logit_change,
    output_change,
    prob_change,
    tvd,
)

LN2 = math.log(2)


def test_tvd_of_a_binary_pair_is_the_probability_difference():
    p = torch.tensor([[0.9, 0.1], [0.3, 0.7], [0.5, 0.5]])
    q = torch.tensor([[0.6, 0.4], [0.3, 0.7], [1.0, 0.0]])
    assert torch.allclose(tvd(p, q), (p[:, 0] - q[:, 0]).abs())
    assert tvd(p, q).shape == (3,)
    assert tvd(torch.tensor([1.0, 0, 0]), torch.tensor([0, 0, 1.0])).item() == 1.0


def test_jsd_bounds_and_analytic_values():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(200, 7, generator=gen), -1)
    q = torch.softmax(3 * torch.randn(200, 7, generator=gen), -1)
    values = jsd(p, q)
    assert torch.all(values >= 0) and torch.all(values <= LN2 + 1e-7)
    assert torch.allclose(jsd(p, p), torch.zeros(()), atol=1e-7)
    assert jsd(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])).item() == pytest.approx(LN2)
    one_hots = torch.eye(4)
    assert torch.allclose(jsd(one_hots, one_hots.roll(1, 0)), torch.full((4,), LN2))
    assert torch.allclose(jsd(p, q), jsd(q, p))  # symmetric
    # by hand: p = (1/2, 1/2), q = (1, 0): m = (3/4, 1/4)
    by_hand = 0.5 * (0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)) \
        + 0.5 * math.log(1 / 0.75)
    assert jsd(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])).item() == \
        pytest.approx(by_hand)


def test_decision_flip_and_cosine_distance():
    p = torch.tensor([[0.6, 0.4], [0.6, 0.4]])
    q = torch.tensor([[0.7, 0.3], [0.4, 0.6]])
    assert decision_flip(p, q).tolist() == [False, True]
    a = torch.randn(5, 16)
    assert torch.allclose(cosine_distance(a, a), torch.zeros(()), atol=1e-6)
    assert torch.allclose(cosine_distance(a, 3 * a), torch.zeros(()), atol=1e-6)
    assert torch.allclose(cosine_distance(a, -a), torch.full((5,), 2.0))
    e = torch.eye(2)
    assert cosine_distance(e[0], e[1]).item() == pytest.approx(1.0)


def test_logit_and_prob_change_for_a_chosen_token():
    before = torch.zeros(2, 3, 4)  # [batch, seq, vocab]
    after = before.clone()
    after[:, -1, 2] = math.log(3.0)  # token 2 at the last position: p 1/4 -> 3/6
    assert torch.allclose(logit_change(before, after, 2), torch.full((2,), math.log(3.0)))
    assert torch.allclose(prob_change(before, after, 2), torch.full((2,), 0.25))
    assert torch.allclose(prob_change(before, after, torch.tensor([2, 0])),
                          torch.tensor([0.25, 1 / 6 - 1 / 4]))
    assert torch.equal(logit_change(before, after, 2, position=0), torch.zeros(2))
    per_example = torch.tensor([2, 0])  # e.g. the last real token of right-padded inputs
    assert torch.allclose(logit_change(before, after, 2, position=per_example),
                          torch.tensor([math.log(3.0), 0.0]))
    with pytest.raises(InputError, match="token must be"):
        logit_change(before, after, torch.tensor([1, 2, 3]))


def test_attention_jsd_is_the_mean_over_valid_rows():
    eye = torch.eye(3)[None]  # [1, q, k]
    flipped = torch.eye(3).flip(-1)[None]  # rows 0, 2 disjoint from eye; row 1 equal
    assert attention_jsd(eye, flipped).item() == pytest.approx(2 * LN2 / 3)
    assert attention_jsd(eye, flipped, query_valid=torch.tensor([True, True, False])).item() \
        == pytest.approx(LN2 / 2)
    padded = torch.zeros(1, 4, 4)
    padded[0, :3, :3] = torch.eye(3)  # a padding row with no weight is not counted
    other = padded.clone()
    other[0, :3, :3] = torch.eye(3).flip(-1)
    assert attention_jsd(padded, other).item() == pytest.approx(2 * LN2 / 3)
    layers_heads = torch.softmax(torch.randn(2, 3, 5, 5), -1)
    assert attention_jsd(layers_heads, layers_heads).shape == (2, 3)


def test_output_change_by_kind():
    before = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    after = torch.tensor([[2.0, 0.0], [1.0, 0.0]])
    out = output_change("classifier", before, after)
    assert set(out) == {"tvd", "jsd", "flip"}
    assert out["flip"].tolist() == [0.0, 1.0] and out["tvd"][0] == 0
    p1, q1 = torch.sigmoid(torch.tensor(-1.0)), torch.sigmoid(torch.tensor(1.0))
    assert out["tvd"][1].item() == pytest.approx((q1 - p1).item(), abs=1e-6)
    lm = output_change("lm", torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    assert set(lm) == {"tvd", "jsd", "flip", "logit_change", "prob_change"}
    assert all(v.shape == (2,) and torch.all(v == 0) for v in lm.values())
    emb = output_change("embedding", torch.ones(3, 8), torch.ones(3, 8))
    assert set(emb) == {"cosine_distance", "l2_distance"}
    assert torch.allclose(emb["cosine_distance"], torch.zeros(3), atol=1e-7)
    with pytest.raises(InputError, match="unknown output kind 'regression'"):
        output_change("regression", before, after)
    with pytest.raises(InputError, match="shapes differ"):
        output_change("classifier", before, after[:1])
    with pytest.raises(InputError, match=r"\[batch, dim\]"):
        output_change("embedding", torch.ones(2, 3, 4), torch.ones(2, 3, 4))
