"""Attribution patching: exact where the metric is linear in the patched activation (a
``ref:induction`` copy without its final norm: the logits are then a linear function of
layer 1's per-head outputs, values and weights), and ranking heads like real patching on
``ref:induction``; the agreement helper."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import attnprobe as ap
from tests.conftest import track
from tests.unit.patch.inputs import induction_pairs


@pytest.fixture(scope="module")
def induction():
    model, tok = ap.load_model("ref:induction")
    clean, corrupt, positions = induction_pairs(tok, n=4)
    return model, tok, clean, corrupt, positions


@pytest.fixture(scope="module")
def linear(induction):
    model, tok, clean, corrupt, positions = induction
    unnormed = copy.deepcopy(model)
    unnormed.norm = nn.Identity().eval()  # logits = W_U (embedding + every head's output)
    return track(unnormed), tok, clean, corrupt, positions


@pytest.mark.parametrize(("site", "direction", "where"), [
    ("output", "denoising", "all"), ("output", "noising", "each"), ("v", "denoising", "each"),
    ("v", "noising", "all"), ("pattern", "denoising", "all"), ("pattern", "noising", "all")])
def test_attribution_is_exact_for_a_metric_linear_in_the_activation(linear, site, direction,
                                                                   where):
    model, tok, clean, corrupt, positions = linear
    if where == "each":
        clean, corrupt, positions = clean[:2], corrupt[:2], positions[:2]
    options = dict(site=site, scope="layer:1", direction=direction, positions=where,
                   metric_positions=positions)
    estimate = ap.patch.attribution(model, tok, clean, corrupt, "logit:next", **options)
    real = ap.patch.heads(model, tok, clean, corrupt, "logit:next", batch_size=64, **options)
    keys = ["example_id", "layer", "head", "position"]
    joined = estimate.merge(real, on=keys, suffixes=("_estimate", "_real"))
    assert len(joined) == len(real) == len(estimate)
    np.testing.assert_allclose(joined["patched_estimate"], joined["patched_real"], atol=1e-4,
                               rtol=1e-4)
    np.testing.assert_allclose(joined["effect_estimate"], joined["effect_real"], atol=1e-4)


def test_attribution_ranks_heads_like_real_patching_on_induction(induction):
    model, tok, clean, corrupt, positions = induction
    estimate = ap.patch.attribution(model, tok, clean, corrupt, "logit:next",
                                    metric_positions=positions)
    real = ap.patch.heads(model, tok, clean, corrupt, "logit:next",
                          metric_positions=positions)
    found = ap.patch.agreement(estimate, real)
    assert found.n == 8 and found.level == "head"
    assert found.pearson > 0.9, found
    assert list(found.table.columns[-2:]) == ["effect_attribution", "effect_patching"]
    rows = ap.patch.agreement(estimate, real, level="row")
    assert rows.n == 8 * 4
    assert "pearson" in repr(found) and "over 8 heads" in repr(found)


def test_agreement_refuses_tables_it_cannot_join(induction):
    model, tok, clean, corrupt, positions = induction
    estimate = ap.patch.attribution(model, tok, clean, corrupt, "logit:next",
                                    scope="layer:0", metric_positions=positions)
    real = ap.patch.heads(model, tok, clean, corrupt, "logit:next", scope="layer:1",
                          metric_positions=positions)
    with pytest.raises(ap.InputError, match="share no"):
        ap.patch.agreement(estimate, real)
    with pytest.raises(ap.InputError, match=r"must come from ap\.patch\.heads"):
        ap.patch.agreement(estimate, estimate)
    with pytest.raises(ap.InputError, match="unknown level"):
        ap.patch.agreement(estimate, real, level="example")


def test_a_frozen_model_is_left_frozen(induction):
    model, tok, clean, corrupt, positions = induction
    frozen = track(copy.deepcopy(model))
    for p in frozen.parameters():
        p.requires_grad_(False)
    table = ap.patch.attribution(frozen, tok, clean, corrupt, "logit:next", scope="layer:1",
                                 metric_positions=positions)
    assert table["effect"].abs().max() > 0
    assert not any(p.requires_grad for p in frozen.parameters())
    assert all(p.grad is None for p in frozen.parameters())


def test_a_caller_under_no_grad_gets_the_same_estimate(linear):
    model, tok, clean, corrupt, positions = linear
    options = dict(scope="layer:1", metric_positions=positions)
    free = ap.patch.attribution(model, tok, clean, corrupt, "logit:next", **options)
    with torch.no_grad():  # e.g. a benchmark or a notebook cell wrapped in no_grad
        inside = ap.patch.attribution(model, tok, clean, corrupt, "logit:next", **options)
        assert not torch.is_grad_enabled()  # the caller's mode is back
    pd.testing.assert_frame_equal(inside, free)
