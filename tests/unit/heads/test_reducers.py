import math

import pytest
import torch

from attnprobe.capture.calls import positions
from attnprobe.heads import Entropy, KeyMass, MaxWeight, OffsetMass, RowBlock, Tally


def block(pattern, valid=None):
    """RowBlock for a self-attention pattern [batch, head, q, k] with a [batch, seq] mask."""
    b, _, q, _k = pattern.shape
    valid = torch.ones(b, q, dtype=torch.bool) if valid is None else valid
    return RowBlock(pattern=pattern, query_valid=valid, query_pos=positions(valid),
                    key_pos=positions(valid), key_len=valid.sum(-1))


def shifted_identity(n, offset):
    """Row i puts all mass on key i+offset (clamped), a pure positional head."""
    eye = torch.zeros(n, n)
    for i in range(n):
        eye[i, min(max(i + offset, 0), n - 1)] = 1.0
    return eye


def test_uniform_rows_have_entropy_log_n_and_max_one_over_n():
    n = 16
    b = block(torch.full((1, 2, n, n), 1 / n))
    assert Entropy()(b)["entropy"] / n == pytest.approx(torch.full((2,), math.log(n)).double())
    assert MaxWeight()(b)["max_weight"] / n == pytest.approx(torch.full((2,), 1 / n).double())


def test_one_hot_rows_have_zero_entropy():
    b = block(shifted_identity(5, -1)[None, None])
    assert Entropy()(b)["entropy"].item() == 0.0
    assert MaxWeight()(b)["max_weight"].item() == 5.0


def test_offset_mass_recovers_a_previous_token_head():
    n = 6
    b = block(shifted_identity(n, -1)[None, None])
    sums = OffsetMass()(b)
    # rows 1..5 put everything on i-1; row 0 (clamped) on itself
    assert sums["prev"].item() == 5 and sums["self"].item() == 1 and sums["next"].item() == 0


def test_padding_rows_are_ignored_and_positions_survive_left_padding():
    n = 5
    right = torch.zeros(1, 1, 7, 7)
    right[0, 0, :n, :n] = shifted_identity(n, 1)
    right[0, 0, n:, 0] = 1.0  # padded query rows: garbage that must not count
    left = torch.zeros(1, 1, 7, 7)
    left[0, 0, 2:, 2:] = shifted_identity(n, 1)
    left[0, 0, :2, 0] = 1.0
    r_valid = torch.tensor([[1, 1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    l_valid = torch.tensor([[0, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    for reducer in (OffsetMass(), KeyMass((0, -1)), Entropy()):
        a, b = reducer(block(right, r_valid)), reducer(block(left, l_valid))
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (reducer, key)
    masses = KeyMass((0, -1))(block(left, l_valid))
    assert masses["key[-1]"].item() == 2  # rows 3 and 4 (clamped) point at the last real token
    assert masses["key[0]"].item() == 0


def test_tally_merges_exactly():
    reducers = [Entropy(), OffsetMass()]
    p = torch.softmax(torch.randn(4, 3, 5, 5), dim=-1)
    whole, first, second = Tally(), Tally(), Tally()
    whole.add(("s", "self", 0), (0, 1, 2), block(p), reducers)
    first.add(("s", "self", 0), (0, 1, 2), block(p[:1]), reducers)
    second.add(("s", "self", 0), (0, 1, 2), block(p[1:]), reducers)
    merged = (first + second).to_frame()
    expected = whole.to_frame()
    assert merged[["statistic", "head", "count"]].equals(expected[["statistic", "head", "count"]])
    # row entropies are summed in float64: splitting the block changes nothing
    entropy = (merged["statistic"] == "entropy").to_numpy()
    assert merged["value"].to_numpy()[entropy] == pytest.approx(
        expected["value"].to_numpy()[entropy], abs=1e-12)
    # the census' offset masses (OffsetMass is a view of them) sum a block's examples in
    # float32 first: 4 examples per cell, a relative error of at most 3 eps each, and means
    # of at most 1
    bound = 4 * torch.finfo(torch.float32).eps
    assert merged["value"].to_numpy()[~entropy] == pytest.approx(
        expected["value"].to_numpy()[~entropy], abs=bound)
    # the mean is over query rows: 4 examples x 5 rows
    assert set(merged["count"]) == {20.0}


def test_tally_refuses_to_merge_different_heads():
    p = torch.full((1, 2, 3, 3), 1 / 3)
    a, b = Tally(), Tally()
    a.add(("s", "self", 0), (0, 1), block(p), [Entropy()])
    b.add(("s", "self", 0), (4, 5), block(p), [Entropy()])
    with pytest.raises(ValueError, match="different heads"):
        a + b


def test_tallies_sum_with_builtin_sum():
    p = torch.full((1, 2, 3, 3), 1 / 3)
    parts = []
    for _ in range(3):
        tally = Tally()
        tally.add(("s", "self", 0), (0, 1), block(p), [MaxWeight()])
        parts.append(tally)
    total = sum(parts)
    assert set(total.to_frame()["count"]) == {9.0}


def test_nan_on_padding_rows_does_not_leak_into_sums():
    p = torch.full((1, 1, 3, 3), 1 / 3)
    p[0, 0, 0] = float("nan")  # a padding row (left padding)
    valid = torch.tensor([[False, True, True]])
    sums = Entropy()(block(p, valid))["entropy"]
    assert torch.isfinite(sums).all()
    assert sums.item() == pytest.approx(2 * math.log(3))


def test_wide_is_the_long_table_pivoted_by_pandas():
    """Means and counts per head equal pandas' pivot of ``to_frame`` (an independent
    reshaping): two sites, a statistic with its own counts, and a head that saw no row of
    it (NaN, as the pivot leaves it)."""
    tally = Tally()
    p = torch.softmax(torch.randn(2, 3, 4, 4), dim=-1)
    for layer in (1, 0):  # added out of order: rows come out in site order
        tally.add(("s", "self", layer), (0, 1, 2), block(p), [Entropy(), MaxWeight()])
    own = (torch.tensor([2.0, 0.0, 3.0], dtype=torch.float64),
           torch.tensor([4.0, 0.0, 5.0], dtype=torch.float64))
    tally.add_sums(("s", "self", 0), (0, 1, 2), 8.0, {"rare": own})
    means, counts = tally.wide()
    frame = tally.to_frame()
    index = ["stack", "kind", "layer", "head", "head_id"]
    for wide, values in ((means, "value"), (counts, "count")):
        pivot = frame.pivot_table(index=index, columns="statistic", values=values, sort=False)
        assert list(wide.columns) == list(pivot.columns) == ["entropy", "max_weight", "rare"]
        assert wide.index.equals(pivot.index)
        assert wide.to_numpy().tobytes() == pivot.to_numpy().tobytes()
    assert means.loc[("s", "self", 0, 2, "L0H2"), "rare"] == 3.0 / 5.0
    assert means["rare"].isna().tolist() == [False, True, False, True, True, True]
    assert tally.summary().columns.tolist() == [*index, "entropy", "max_weight", "rare"]
