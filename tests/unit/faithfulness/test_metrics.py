"""Faithfulness metrics against hand-computed values on a bag-of-words classifier.

On :class:`BagOfWords` the output after removing a set ``R`` of tokens is
``sigmoid(S − Σ_{j∈R} w_j)`` (``S`` the full sum), so every metric has a closed form, written
out below with plain torch in float64. The model runs in float32: a sum of ``m`` terms is
exact to ``m · eps32 · Σ|w|`` (the textbook bound for recursive summation), and sigmoid's
slope is at most 1/4, which gives the tolerances.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnprobe.errors import InputError
from attnprobe.faithfulness.metrics import (
    DEFAULT_LEVELS,
    abpc,
    aopc,
    bootstrap_ci,
    comprehensiveness,
    curve_area,
    curve_counts,
    leave_one_out_scores,
    loo_tau,
    random_ranking,
    ranking,
    removal_counts,
    sufficiency,
)
from attnprobe.faithfulness.removal import Removal, pad_batch, perturb, perturb_ranked
from tests.unit.faithfulness.bag_of_words import (
    MASK,
    PAD,
    BagOfWords,
    special_of,
    text,
    weights,
)

EPS32 = float(torch.finfo(torch.float32).eps)
N_REAL = 20
# removal_counts(20) by hand: round-half-up of 0.2, 1, 2, 4, 10, at least one token
COUNTS_20 = [1, 1, 2, 4, 10]
REMOVALS = [Removal("delete"), Removal("attention"), Removal("replace", MASK, "[MASK]")]


def prob(model: BagOfWords, ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """``p(class 1)`` per row of a batch."""
    with torch.no_grad():
        return torch.softmax(model(ids, mask), -1)[:, 1].double().numpy()


def outputs(model, ids, special, order, counts, removal, *, keep=False, allow_all=False):
    """The model's ``p(class 1)`` for each count (the code under test builds the inputs)."""
    items = [perturb_ranked(ids, None, special, order, int(k), removal, keep=keep,
                            allow_all_real=allow_all) for k in counts]
    batch, mask = pad_batch(items, PAD)
    return prob(model, batch, mask)


@pytest.fixture
def case():
    w = weights()
    ids = text(N_REAL)
    special = special_of(ids)
    tokw = w.double()[ids]               # [seq] each position's weight
    real_w = tokw[~special]              # [n]
    total = float(tokw.sum())            # S
    tol = (N_REAL + 2) * EPS32 * float(tokw.abs().sum())
    return BagOfWords(w), ids, special, tokw, real_w, total, tol


def test_removal_counts_and_curve_counts_by_hand():
    assert removal_counts(N_REAL) == COUNTS_20
    assert removal_counts(200) == [2, 10, 20, 40, 100]
    assert removal_counts(2) == [1, 1, 1, 1, 1]        # at most n − 1: one token stays
    assert removal_counts(3, [0.99]) == [2]
    assert curve_counts(3).tolist() == [0, 1, 2, 3]
    with pytest.raises(InputError, match="at least 2 real tokens"):
        removal_counts(1)
    for bad in (0.0, 1.0, -0.1, 1.5, True):
        with pytest.raises(InputError, match="share in"):
            removal_counts(10, [bad])


def test_comprehensiveness_sufficiency_aopc_equal_the_closed_form(case):
    model, ids, special, tokw, real_w, total, tol = case
    order = ranking(tokw.float(), special)  # the planted explanation: the true weights
    desc = torch.sort(real_w, descending=True).values
    top = torch.cat([torch.zeros(1, dtype=torch.float64), desc.cumsum(0)])  # Σ of top k
    full = 1 / (1 + math.exp(-total))
    counts = removal_counts(N_REAL, DEFAULT_LEVELS)
    want_comp = np.array([full - torch.sigmoid(torch.tensor(total) - top[k]).item()
                          for k in COUNTS_20])
    specials = total - float(real_w.sum())
    want_suff = np.array([full - torch.sigmoid(torch.tensor(specials) + top[k]).item()
                          for k in COUNTS_20])
    for removal in REMOVALS:
        comp = comprehensiveness(full, outputs(model, ids, special, order, counts, removal))
        suff = sufficiency(full, outputs(model, ids, special, order, counts, removal,
                                         keep=True))
        np.testing.assert_allclose(comp, want_comp, rtol=0, atol=tol / 4 + EPS32)
        np.testing.assert_allclose(suff, want_suff, rtol=0, atol=tol / 4 + EPS32)
        assert aopc(comp) == pytest.approx(want_comp.sum() / 5, abs=tol / 4 + EPS32)
        assert aopc(comp, include_zero=True) == pytest.approx(want_comp.sum() / 6,
                                                              abs=tol / 4 + EPS32)


def test_deletion_curves_areas_and_abpc_by_hand(case):
    model, ids, special, tokw, real_w, total, tol = case
    order = ranking(tokw, special)
    counts = curve_counts(N_REAL)
    desc = torch.sort(real_w, descending=True).values
    asc = desc.flip(0)
    morf_want = [torch.sigmoid(torch.tensor(total) - desc[:k].sum()).item() for k in counts]
    lerf_want = [torch.sigmoid(torch.tensor(total) - asc[:k].sum()).item() for k in counts]

    def trapezoid(ys):  # x = k / n, steps of 1 / n
        return sum((ys[i] + ys[i + 1]) / 2 / N_REAL for i in range(N_REAL))

    removal = Removal("delete")
    morf = outputs(model, ids, special, order, counts, removal, allow_all=True)
    lerf = outputs(model, ids, special, order[::-1], counts, removal, allow_all=True)
    np.testing.assert_allclose(morf, morf_want, rtol=0, atol=tol / 4 + EPS32)
    np.testing.assert_allclose(lerf, lerf_want, rtol=0, atol=tol / 4 + EPS32)
    assert curve_area(morf, counts, N_REAL) == pytest.approx(trapezoid(morf_want),
                                                              abs=tol / 4 + EPS32)
    assert abpc(morf, lerf, counts, N_REAL) == pytest.approx(
        trapezoid(lerf_want) - trapezoid(morf_want), abs=tol / 2 + EPS32)
    # insertion MoRF (keep the top k): from the specials alone up to the full text
    ins = outputs(model, ids, special, order, counts, removal, keep=True, allow_all=True)
    specials = total - float(real_w.sum())
    ins_want = [torch.sigmoid(torch.tensor(specials) + desc[:k].sum()).item() for k in counts]
    np.testing.assert_allclose(ins, ins_want, rtol=0, atol=tol / 4 + EPS32)


def test_curve_area_on_a_three_point_curve():
    # x = 0, .5, 1: (1 + .5)/2 · .5 + (.5 + 0)/2 · .5 = .375 + .125
    assert curve_area([1.0, 0.5, 0.0], [0, 1, 2], 2) == pytest.approx(0.5)
    assert abpc([1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0, 1, 2], 2) == pytest.approx(0.5)
    with pytest.raises(InputError, match="increase"):
        curve_area([1.0, 0.5], [1, 1], 2)


def test_the_planted_explanation_beats_random_orders(case):
    model, ids, special, tokw, _, total, _ = case
    full = 1 / (1 + math.exp(-total))
    counts = removal_counts(N_REAL)
    steps = curve_counts(N_REAL)
    removal = Removal("attention")

    def scores(order):
        comp = aopc(comprehensiveness(full, outputs(model, ids, special, order, counts,
                                                    removal)))
        suff = aopc(sufficiency(full, outputs(model, ids, special, order, counts, removal,
                                              keep=True)))
        gap = abpc(outputs(model, ids, special, order, steps, removal, allow_all=True),
                   outputs(model, ids, special, order[::-1], steps, removal, allow_all=True),
                   steps, N_REAL)
        return comp, suff, gap

    planted = scores(ranking(tokw, special))
    randoms = np.array([scores(random_ranking(special, seed)) for seed in range(20)])
    # the weight order is optimal for a monotone function of a sum: it can only tie
    assert planted[0] >= randoms[:, 0].max() and planted[0] > randoms[:, 0].mean()
    assert planted[1] <= randoms[:, 1].min() and planted[1] < randoms[:, 1].mean()
    assert planted[2] >= randoms[:, 2].max() and planted[2] > 0


def test_tau_with_leave_one_out_is_one_for_the_true_weights(case):
    model, ids, special, tokw, real_w, total, _ = case
    positions = (~special).nonzero().flatten().tolist()
    with torch.no_grad():
        logit = [model(perturb(ids, None, special, [p], Removal("delete")).input_ids[None],
                       torch.ones(1, ids.numel() - 1, dtype=torch.long))[0, 1].item()
                 for p in positions]
    loo = leave_one_out_scores(total, logit)        # on the logit, f(x) − f(x \ j) = w_j
    np.testing.assert_allclose(loo, real_w.numpy(), rtol=0,
                               atol=(N_REAL + 2) * EPS32 * float(tokw.abs().sum()))
    # ties (a word drawn twice) are ties in both vectors: τ-b is exactly 1
    assert loo_tau(tokw, real_w, special) == pytest.approx(1.0)
    assert loo_tau(-tokw, real_w, special) == pytest.approx(-1.0)
    with pytest.raises(InputError, match="real tokens"):
        loo_tau(tokw, real_w[:-1], special)


def test_ranking_rules_and_refusals():
    special = [True, False, False, False, True]
    assert ranking([5.0, -0.9, 0.5, 0.1, 5.0], special).tolist() == [2, 3, 1]
    assert ranking([5.0, -0.9, 0.5, 0.1, 5.0], special, magnitude=True).tolist() == [1, 2, 3]
    assert ranking([0.0, 1.0, 2.0, 2.0, 0.0], special).tolist() == [2, 3, 1]  # ties: earlier
    with pytest.raises(InputError, match="constant"):
        ranking([9.0, 0.3, 0.3, 0.3, 9.0], special)
    with pytest.raises(InputError, match="NaN"):
        ranking([0.0, float("nan"), 1.0, 2.0, 0.0], special)
    with pytest.raises(InputError, match="only special"):
        ranking([1.0, 2.0], [True, True])
    perm = random_ranking(special, seed=3)
    assert sorted(perm.tolist()) == [1, 2, 3]
    assert perm.tolist() == random_ranking(special, seed=3).tolist()


def test_outputs_that_are_not_numbers_are_refused():
    with pytest.raises(InputError, match="NaN"):
        comprehensiveness(0.5, [0.1, float("nan")])
    with pytest.raises(InputError, match="full text"):
        sufficiency(float("inf"), [0.1])
    with pytest.raises(InputError, match="no removal level"):
        aopc([])


def test_bootstrap_ci_is_seeded_and_matches_the_normal_interval():
    rng = np.random.default_rng(7)
    x = rng.normal(2.0, 1.0, size=400)
    mean, low, high = bootstrap_ci(x, n_boot=4000, seed=1)
    assert mean == pytest.approx(float(x.mean()), abs=1e-12)
    assert (mean, low, high) == bootstrap_ci(x, n_boot=4000, seed=1)
    assert (low, high) != bootstrap_ci(x, n_boot=4000, seed=2)[1:]
    # the percentile interval of a mean of 400 normals ≈ mean ± 1.96 · s / √n (10 % slack for
    # the bootstrap's own Monte-Carlo error at 4000 resamples)
    half = 1.959964 * x.std() / math.sqrt(x.size)
    assert low < mean < high
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)
    assert bootstrap_ci([0.3]) == (0.3, 0.3, 0.3)
    with pytest.raises(InputError, match="NaN"):
        bootstrap_ci([0.1, float("nan")])
    with pytest.raises(InputError, match="no example"):
        bootstrap_ci([])
