"""Interventions on synthetic patterns: masks kept, rows renormalised, only scoped heads
touched, reproducible draws; the registry's errors."""

from __future__ import annotations

import pytest
import torch

from attnprobe.errors import InputError
from attnprobe.perturb.interventions import (
    INTERVENTIONS,
    Dirichlet,
    Erase,
    Mean,
    Permute,
    Uniform,
    Zero,
    describe,
    make_intervention,
)

BATCH, HEADS, N = 3, 4, 6
LENGTHS = (6, 4, 5)  # right padding: example b has LENGTHS[b] real tokens


def masked_pattern(causal: bool, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax of random scores with padding keys (and the causal future) at exactly 0, as HF
    masks give them. Padding query rows attend to the real keys, like BERT's. Returns the
    pattern ``[batch, head, query, key]`` and the bool mask of allowed keys."""
    gen = torch.Generator().manual_seed(seed)
    scores = 3 * torch.randn(BATCH, HEADS, N, N, generator=gen)
    real = torch.arange(N)[None, :] < torch.tensor(LENGTHS)[:, None]  # [batch, key]
    allowed = real[:, None, None, :].expand(BATCH, HEADS, N, N)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    pattern = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
    return pattern, allowed


PATTERN_INTERVENTIONS = [Permute(), Uniform(), Zero(), Erase(k=1), Erase(k=2), Dirichlet(0.3),
                         Dirichlet(1.0)]


@pytest.mark.parametrize("intervention", PATTERN_INTERVENTIONS, ids=repr)
@pytest.mark.parametrize("causal", [False, True])
def test_rows_stay_on_valid_keys_and_only_scoped_heads_change(intervention, causal):
    pattern, allowed = masked_pattern(causal)
    before = pattern.clone()
    gen = torch.Generator().manual_seed(1)
    out = intervention(pattern, [1, 3], gen, layer=0)
    assert torch.equal(pattern, before)  # input untouched
    assert out.shape == pattern.shape
    for head in (0, 2):  # outside the scope: bit-identical
        assert torch.equal(out[:, head], pattern[:, head])
    edited = out[:, [1, 3]]
    ok = allowed[:, [1, 3]]
    assert torch.all(edited[~ok] == 0)  # padding and the causal future keep weight 0
    assert torch.all(edited >= 0)
    sums = edited.sum(-1)
    n_valid = ok.sum(-1)
    if isinstance(intervention, Zero):
        assert torch.all(edited == 0)
    elif isinstance(intervention, Erase):  # rows keeping a key sum to 1, the others to 0
        keeps = n_valid > intervention.k
        assert torch.allclose(sums[keeps], torch.ones(()), atol=1e-6)
        assert torch.all(sums[~keeps] == 0)
        if causal:
            assert not keeps[:, :, 0].any()  # row 0 of a causal model had a single key
    else:
        assert torch.allclose(sums, torch.ones(()), atol=1e-6)


@pytest.mark.parametrize("intervention", PATTERN_INTERVENTIONS, ids=repr)
def test_all_heads_when_heads_is_none_and_errors_out_of_range(intervention):
    pattern, _ = masked_pattern(False)
    out = intervention(pattern, None, torch.Generator().manual_seed(0))
    for head in range(HEADS):
        assert not torch.equal(out[:, head], pattern[:, head])
    with pytest.raises(InputError, match=r"out of range.*4 heads"):
        intervention(pattern, [4], None)
    with pytest.raises(InputError, match=r"\[batch, head"):
        intervention(pattern[0], None, None)


def test_uniform_is_one_over_n_valid_keys():
    pattern, allowed = masked_pattern(True)
    out = Uniform()(pattern, None)
    expected = allowed.float() / allowed.sum(-1, keepdim=True)
    assert torch.equal(out, expected)
    assert out[0, 0, 2, :3].tolist() == pytest.approx([1 / 3] * 3)


def test_permute_shuffles_within_each_row_and_leaves_uniform_rows_identical():
    pattern, _ = masked_pattern(False)
    out = Permute()(pattern, None, torch.Generator().manual_seed(0))
    # the same multiset of weights in every row (so the same row sum)
    assert torch.equal(out.sort(-1).values, pattern.sort(-1).values)
    assert not torch.equal(out, pattern)
    uniform = Uniform()(pattern, None)
    assert torch.equal(Permute()(uniform, None, torch.Generator().manual_seed(0)), uniform)


def test_every_batch_row_gets_its_own_permutation_and_draws_are_batch_independent():
    row = torch.softmax(torch.arange(8.0), -1)  # peaked, all distinct
    copies = row.expand(100, 2, 1, 8).contiguous()
    out = Permute()(copies, [0], torch.Generator().manual_seed(0))
    distinct = {tuple(r.tolist()) for r in out[:, 0, 0]}
    assert len(distinct) > 90  # 8! orders; near-certain to be all different
    assert torch.equal(out[:, 1], copies[:, 1])
    # one batch of 100 consumes the generator exactly like 100 batches of 1
    gen = torch.Generator().manual_seed(0)
    one_by_one = torch.cat([Permute()(copies[i:i + 1], [0], gen) for i in range(100)])
    assert torch.equal(out, one_by_one)


@pytest.mark.parametrize("intervention", [Permute(), Dirichlet(0.5)], ids=repr)
def test_random_interventions_are_seeded(intervention):
    pattern, _ = masked_pattern(True)
    a = intervention(pattern, None, torch.Generator().manual_seed(7))
    b = intervention(pattern, None, torch.Generator().manual_seed(7))
    c = intervention(pattern, None, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_erase_top_k_by_hand():
    row = torch.tensor([0.1, 0.4, 0.2, 0.3, 0.0])[None, None, None]  # last key masked
    assert torch.allclose(Erase(k=1)(row, None)[0, 0, 0],
                          torch.tensor([0.1, 0.0, 0.2, 0.3, 0.0]) / 0.6)
    assert torch.allclose(Erase(k=2)(row, None)[0, 0, 0],
                          torch.tensor([1 / 3, 0.0, 2 / 3, 0.0, 0.0]))
    assert torch.equal(Erase(k=4)(row, None), torch.zeros_like(row))  # nothing left
    assert torch.equal(Erase(k=9)(row, None), torch.zeros_like(row))  # k beyond the keys


def test_erase_given_keys():
    row = torch.tensor([0.1, 0.4, 0.2, 0.3])[None, None, None].expand(2, 2, 1, 4)
    by_position = Erase(keys=torch.tensor([0, 2]))(row, [1])
    assert torch.allclose(by_position[:, 1, 0], torch.tensor([0.0, 4 / 7, 0.0, 3 / 7]))
    assert torch.equal(by_position[:, 0], row[:, 0])
    mask = torch.zeros(2, 1, 1, 4, dtype=torch.bool)
    mask[0, ..., 1] = True  # example 0: erase key 1; example 1: nothing
    by_mask = Erase(keys=mask)(row, None)
    assert torch.allclose(by_mask[0, :, 0], torch.tensor([1 / 6, 0.0, 2 / 6, 3 / 6]))
    assert torch.allclose(by_mask[1], row[1])
    with pytest.raises(InputError, match="out of range"):
        Erase(keys=torch.tensor([4]))(row, None)
    with pytest.raises(InputError, match="broadcast"):
        Erase(keys=torch.zeros(3, 1, 1, 4, dtype=torch.bool))(row, None)
    with pytest.raises(InputError, match="1-D tensor"):
        Erase(keys=torch.tensor([[0]]))


def test_dirichlet_is_a_fair_draw_even_for_tiny_alpha():
    row = torch.full((4000, 1, 1, 5), 0.2)
    drawn = Dirichlet(1.0)(row, None, torch.Generator().manual_seed(0))
    assert torch.allclose(drawn.mean(0).flatten(), torch.full((5,), 0.2), atol=0.01)
    # Dirichlet(1) marginals are Beta(1, 4): variance 4 / (25 * 6)
    assert drawn[:, 0, 0, 0].var().item() == pytest.approx(4 / 150, rel=0.1)
    sparse = Dirichlet(1e-3)(row[:50], None, torch.Generator().manual_seed(0))
    assert torch.isfinite(sparse).all()
    assert torch.allclose(sparse.sum(-1), torch.ones(()), atol=1e-6)
    assert (sparse.amax(-1) > 0.99).float().mean() > 0.9  # mass on one key, as α → 0


def test_mean_replaces_head_outputs():
    means = {2: torch.arange(8.0).view(4, 2)}  # 4 heads, d_head 2
    output = torch.randn(3, 4, 5, 2)
    out = Mean(means)(output, [1, 2], layer=2)
    assert torch.equal(out[:, [0, 3]], output[:, [0, 3]])
    assert torch.equal(out[:, 1], torch.tensor([2.0, 3.0]).expand(3, 5, 2))
    assert torch.equal(out[:, 2], torch.tensor([4.0, 5.0]).expand(3, 5, 2))
    with pytest.raises(InputError, match="no means for layer 1"):
        Mean(means)(output, None, layer=1)
    with pytest.raises(InputError, match="no means for layers"):
        Mean(means).check([0, 2], 4)
    with pytest.raises(InputError, match="4 heads"):
        Mean({0: torch.zeros(3, 2)}).check([0], 4)
    with pytest.raises(InputError, match="head_output_means"):
        Mean()
    with pytest.raises(InputError, match="NaN"):
        Mean({0: torch.full((4, 2), float("nan"))})
    assert Mean.acts_on == "output" and Permute.acts_on == "pattern"


def test_registry_and_make_intervention():
    assert INTERVENTIONS.names() == ["dirichlet", "erase", "mean", "permute", "uniform", "zero"]
    assert make_intervention("erase", k=2).k == 2
    assert make_intervention("dirichlet", alpha=0.5) == Dirichlet(0.5)
    with pytest.raises(InputError, match=r"unknown intervention 'shuffle'.*'permute'"):
        make_intervention("shuffle")
    for name, params in [("erase", {"k": 0}), ("erase", {"k": 1.5}), ("erase", {"k": True}),
                         ("dirichlet", {"alpha": 0}), ("dirichlet", {"alpha": -1.0}),
                         ("dirichlet", {"alpha": float("nan")}),
                         ("dirichlet", {"alpha": float("inf")})]:
        with pytest.raises(InputError, match="must be a positive"):
            make_intervention(name, **params)
    with pytest.raises(InputError, match="takes k, keys; got alpha"):
        make_intervention("erase", alpha=1.0)
    with pytest.raises(InputError, match="takes no parameters"):
        make_intervention("permute", k=1)
    assert describe(Erase(k=3)) == {"k": 3, "keys": None}
    assert describe(Erase(keys=torch.tensor([1, 2]))) == {"k": 1, "keys": "tensor[2]"}
