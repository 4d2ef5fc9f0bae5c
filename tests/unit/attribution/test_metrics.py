"""Agreement metrics by construction (methods §13 self-tests 5 and 7)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnprobe.attribution.metrics import (
    agreement,
    jsd,
    kendall_tau,
    spearman,
    topk_overlap,
    truth_scores,
)
from attnprobe.errors import InputError
from attnprobe.types import TokenAttribution

X = torch.tensor([0.1, 0.5, 0.2, 0.9, 0.3, 0.05])


def attribution(scores, method="m", tokens=None) -> TokenAttribution:
    tokens = tokens or tuple(f"t{i}" for i in range(len(scores)))
    return TokenAttribution(torch.as_tensor(scores, dtype=torch.float64), tokens, method, "")


def test_rank_correlations_of_a_vector_with_itself_and_its_negation():
    tau, p = kendall_tau(X, X)
    assert tau == pytest.approx(1.0) and p < 0.05
    assert kendall_tau(X, -X)[0] == pytest.approx(-1.0)
    assert spearman(X, X)[0] == pytest.approx(1.0)
    assert spearman(X, -X)[0] == pytest.approx(-1.0)
    # ties: scipy's tau-b, average ranks
    assert kendall_tau([1, 1, 2], [1, 2, 3])[0] == pytest.approx(2 / math.sqrt(6))


def test_rank_correlations_refuse_constant_or_mismatched_vectors():
    with pytest.raises(InputError, match="flat is constant"):
        kendall_tau(X, torch.ones(6), names=("x", "flat"))
    with pytest.raises(InputError, match="constant"):
        spearman(torch.zeros(6), X)
    with pytest.raises(InputError, match="6 scores but b has 5"):
        kendall_tau(X, X[:5])
    with pytest.raises(InputError, match="at least 2"):
        spearman([1.0], [2.0])
    with pytest.raises(InputError, match="NaN"):
        kendall_tau(X, torch.tensor([0, 1, 2, 3, 4, float("nan")]))
    rho, p = spearman([1.0, 2.0], [3.0, 5.0])  # scipy's p is NaN with two tokens
    assert rho == pytest.approx(1.0) and p == 1.0


def test_jsd_bounds_by_construction():
    assert jsd(X, X) == pytest.approx(0.0, abs=1e-12)
    assert jsd(X, 3 * X) == pytest.approx(0.0, abs=1e-12)  # normalised
    assert jsd(X, -X) == pytest.approx(0.0, abs=1e-12)  # magnitudes
    assert jsd([1, 0, 0], [0, 1, 0]) == pytest.approx(math.log(2))
    half = jsd([1, 0], [0.5, 0.5])
    # m = (0.75, 0.25): KL(p||m) = ln(1/0.75), KL(q||m) = 0.5 ln(0.5/0.75) + 0.5 ln 2
    expected = 0.5 * np.log(1 / 0.75) + 0.5 * (0.5 * np.log(0.5 / 0.75) + 0.5 * np.log(2))
    assert half == pytest.approx(expected)
    assert 0 < half < math.log(2)
    with pytest.raises(InputError, match="zero on every token"):
        jsd([0, 0], [1, 2])


def test_jsd_is_the_core_divergence_of_the_normalised_magnitudes():
    from scipy.spatial.distance import jensenshannon

    from attnprobe.core import divergence

    rng = np.random.default_rng(0)
    for _ in range(5):
        a, b = rng.normal(size=9), rng.normal(size=9)  # signed: magnitudes are compared
        p, q = np.abs(a) / np.abs(a).sum(), np.abs(b) / np.abs(b).sum()
        want = jensenshannon(p, q) ** 2  # scipy: natural log by default
        assert jsd(a, b) == pytest.approx(want, abs=1e-12)
        assert jsd(a, b) == float(divergence.jsd(torch.from_numpy(p), torch.from_numpy(q)))


def test_topk_overlap_uses_magnitudes():
    a = [0.9, 0.1, -0.8, 0.0]
    assert topk_overlap(a, [1, 0, 1, 0], 2) == 1.0
    assert topk_overlap(a, [0, 1, 0, 1], 2) == 0.0
    assert topk_overlap(a, [5, 4, 0, 0], 2) == 0.5
    with pytest.raises(InputError, match="k must be"):
        topk_overlap(a, a, 0)
    with pytest.raises(InputError, match="k must be"):
        topk_overlap(a, a, 5)


def test_agreement_with_keep_mask_and_default_k():
    x = attribution([10.0, 0.1, 0.5, 0.2, 0.9, 0.3, 0.05, 0.4, 0.6, 0.7, 0.8, 7.0], "x")
    y = attribution([0.0, 0.1, 0.5, 0.2, 0.9, 0.3, 0.05, 0.4, 0.6, 0.7, 0.8, 0.0], "y")
    keep = torch.ones(12, dtype=torch.bool)
    keep[[0, -1]] = False  # drop the "special" tokens
    scores = agreement(x, y, keep=keep)
    assert set(scores) == {"kendall_tau", "spearman", "topk_overlap", "jsd"}
    assert scores["kendall_tau"][0] == pytest.approx(1.0)
    assert scores["spearman"][0] == pytest.approx(1.0)
    assert scores["topk_overlap"] == (1.0, None)  # k = round(0.2 * 10) = 2
    assert scores["jsd"][0] == pytest.approx(0.0, abs=1e-12)
    assert agreement(x, y)["kendall_tau"][0] < 1.0  # the specials disagree
    assert agreement(x, y, keep=keep, k=50)["topk_overlap"][0] == 1.0  # k capped at n


def test_agreement_refuses_different_tokens_and_constant_vectors():
    x = attribution([1.0, 2.0, 3.0], "x")
    with pytest.raises(InputError, match="different tokens"):
        agreement(x, attribution([1.0, 2.0, 3.0], "y", tokens=("a", "b", "c")))
    with pytest.raises(InputError, match="flat is constant"):
        agreement(x, attribution([1.0, 1.0, 1.0], "flat"))
    with pytest.raises(InputError, match="fewer than two"):
        agreement(x, x, keep=torch.tensor([True, False, False]))
    with pytest.raises(InputError, match="boolean"):
        agreement(x, x, keep=torch.tensor([1, 0, 1]))


def test_truth_scores_perfect_reversed_and_tied():
    truth = torch.tensor([False, True, False, True, False])
    perfect = truth_scores(torch.tensor([0.1, 0.9, 0.2, -0.8, 0.0]), truth)
    assert perfect == {"precision_at_k": 1.0, "auroc": 1.0,
                       "mass_on_truth": pytest.approx(1.7 / 2.0)}
    reversed_ = truth_scores(torch.tensor([0.9, 0.1, 0.8, 0.0, 0.7]), truth)
    assert reversed_["auroc"] == 0.0 and reversed_["precision_at_k"] == 0.0
    tied = truth_scores(torch.ones(5), truth)
    assert tied["auroc"] == 0.5 and tied["mass_on_truth"] == pytest.approx(0.4)
    # one true token ranked second of four: AUROC = 2/3
    assert truth_scores([0.9, 0.5, 0.1, 0.2], [False, True, False, False])["auroc"] == \
        pytest.approx(2 / 3)
    with pytest.raises(InputError, match="at least one true and one false"):
        truth_scores(torch.ones(3), torch.ones(3, dtype=torch.bool))
