"""One set of per-head statistics: the simple reducers are views of the census statistics,
the reducer loop is one function, and ``RowBlock`` lives with its producer."""

import math
from typing import ClassVar

import pytest
import torch

from attnprobe.capture.calls import positions
from attnprobe.core.row_blocks import RowBlock
from attnprobe.heads import Entropy, KeyMass, MaxWeight, OffsetMass, Tally, default_reducers
from attnprobe.heads.stats import STATS, Column, Stat
from attnprobe.heads.tile import Tile, TileSpec

EPS32 = torch.finfo(torch.float32).eps


def _block(pattern, valid=None):
    b, _, q, _k = pattern.shape
    valid = torch.ones(b, q, dtype=torch.bool) if valid is None else valid
    return RowBlock(pattern=pattern, query_valid=valid, query_pos=positions(valid),
                    key_pos=positions(valid), key_len=valid.sum(-1))


def _random(batch=2, heads=3, n=7, seed=0):
    return torch.softmax(torch.randn(batch, heads, n, n,
                                     generator=torch.Generator().manual_seed(seed)), -1)


def test_row_block_is_defined_by_its_producer():
    assert RowBlock.__module__ == "attnprobe.core.row_blocks"


@pytest.mark.parametrize(("view", "stat", "columns"), [
    (Entropy(), "rows", {"entropy": "entropy"}),
    (MaxWeight(), "rows", {"max_weight": "max_weight"}),
    (OffsetMass(), "offsets", {"offset@-1": "prev", "offset@+0": "self", "offset@+1": "next"}),
])
def test_the_simple_reducers_select_census_statistic_columns(view, stat, columns):
    """Each simple reducer gives exactly what the census statistic, run on its own, sums."""
    block = _block(_random())
    assert view.stat == stat
    census = STATS.get(stat)(Tile(block, TileSpec(max_offset=1)))
    sums = view(block)
    assert list(sums) == list(columns.values())
    for column, name in columns.items():
        assert torch.equal(sums[name], census[column])


def test_views_equal_the_definitions_computed_row_by_row():
    """Entropy, max weight and offset masses against loops over single rows (float64)."""
    valid = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    logits = torch.randn(2, 2, 6, 6, generator=torch.Generator().manual_seed(1))
    p = torch.softmax(logits.masked_fill(~valid[:, None, None, :], float("-inf")), -1)
    block = _block(p, valid)
    want = {name: torch.zeros(2, dtype=torch.float64)
            for name in ("entropy", "max_weight", "prev", "self", "next")}
    for b in range(2):
        n = int(valid[b].sum())
        for h in range(2):
            for i in range(n):
                row = p[b, h, i].double()
                want["entropy"][h] -= sum(float(w) * math.log(w) for w in row[:n] if w > 0)
                want["max_weight"][h] += float(row.max())
                for name, j in (("prev", i - 1), ("self", i), ("next", i + 1)):
                    if 0 <= j < n:
                        want[name][h] += float(row[j])
    got = {}
    for reducer in (Entropy(), MaxWeight(), OffsetMass()):
        got.update(reducer(block))
    for name, expected in want.items():
        # float32 terms summed over <= 6 keys and 10 rows: a few ulps of each row's value
        tol = 16 * EPS32 * max(1.0, float(expected.abs().max()))
        assert torch.allclose(got[name], expected, rtol=0, atol=tol), name


def test_offsets_the_block_does_not_reach_count_zero():
    """A one-token input has no previous or next key: the view gives 0, not a missing
    statistic (the mean stays over every row)."""
    sums = OffsetMass((-2, -1, 0, 1))(_block(torch.ones(1, 2, 1, 1)))
    assert list(sums) == ["offset-2", "prev", "self", "next"]
    assert sums["self"].tolist() == [1.0, 1.0]
    assert sums["prev"].tolist() == sums["offset-2"].tolist() == [0.0, 0.0]


def test_reducers_of_one_block_read_one_tile(monkeypatch):
    """Entropy and MaxWeight read the same statistic: one Tile (one pass of each row
    quantity) per block, not one per reducer."""
    import attnprobe.heads.stat_views as views

    made = []

    class Counting(Tile):
        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(views, "Tile", Counting)
    tally = Tally()
    tally.add(("s", "self", 0), (0, 1, 2), _block(_random()), [Entropy(), MaxWeight()])
    assert len(made) == 1


def test_smoothing_mixes_a_uniform_row_in_first():
    p = torch.zeros(1, 1, 4, 4)
    p[..., 0] = 1.0  # one-hot rows
    s = 0.1
    smoothed = (1 - s) * p + s / 4
    expected = -(smoothed * smoothed.log()).sum(-1).sum()
    got = Entropy(smoothing=s)(_block(p))["entropy"]
    assert got.item() == pytest.approx(float(expected), rel=8 * EPS32)


def test_a_view_of_a_throwaway_statistic():
    """A view is any selection of a registered statistic's columns, renamed."""
    from attnprobe.heads.stat_views import StatView

    class Twice(Stat):
        group: ClassVar[str] = "twice"
        columns: ClassVar[tuple[Column, ...]] = (Column("twice", "2 per row"),)

        def __call__(self, tile):
            return {"twice": tile.row_sum(2 * torch.ones_like(tile.a[..., 0]))}

    class TwiceView(StatView):
        stat: ClassVar[str] = "throwaway_twice"

        def selected(self):
            return {"twice": "two"}

    STATS.register("throwaway_twice")(Twice())
    try:
        sums = TwiceView()(_block(_random(batch=1, heads=2, n=3)))
    finally:
        STATS.unregister("throwaway_twice")
    assert sums["two"].tolist() == [6.0, 6.0]  # 3 rows of 2, per head


def test_default_reducers_come_from_the_registry():
    names = [type(r).__name__ for r in default_reducers()]
    assert names == ["Entropy", "MaxWeight", "OffsetMass", "KeyMass"]  # the documented summary
    assert isinstance(default_reducers()[-1], KeyMass)


def test_the_reducer_loop_merges_in_order():
    from attnprobe.core.reducers import reduce_block

    block = _block(_random())
    sums = reduce_block([Entropy(), OffsetMass(), KeyMass((0,))], block)
    assert list(sums) == ["entropy", "prev", "self", "next", "key[0]"]


def test_nan_in_padding_rows_stays_out_of_every_view():
    """A model may leave NaN in fully masked padding rows; summing rows before masking them
    (the census' offset diagonals) must not carry it into a real row's sums."""
    valid = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    clean = torch.zeros(1, 2, 4, 4)
    clean[..., :3] = 1 / 3
    dirty = clean.clone()
    dirty[:, :, 3] = float("nan")
    for reducer in (Entropy(), MaxWeight(), OffsetMass()):
        got, want = reducer(_block(dirty, valid)), reducer(_block(clean, valid))
        for name in want:
            assert torch.equal(got[name], want[name]), name


def test_a_throwaway_reducer_is_listed_by_the_readme_generator():
    from dataclasses import dataclass
    from pathlib import Path

    from attnprobe.core.reducers import REDUCERS
    from attnprobe.readme import render_readme, stale_parts

    readme = (Path(__file__).parents[3] / "README.md").read_text()
    assert "reducers" not in stale_parts(readme)

    @dataclass(frozen=True)
    class RowCount:
        """Rows seen per head (a throw-away test reducer)."""

        name: str = "row_count"

        def __call__(self, block):
            return {"rows": block.masked_row_sum(torch.ones_like(block.pattern[..., 0]))}

    REDUCERS.register("throwaway_rows")(RowCount)
    try:
        rendered = render_readme(readme)
    finally:
        REDUCERS.unregister("throwaway_rows")
    assert "`RowCount` (`throwaway_rows`): Rows seen per head (a throw-away test reducer)" \
        in rendered
