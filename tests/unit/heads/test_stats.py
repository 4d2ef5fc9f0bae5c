"""The statistics pipeline: each statistic declares its columns and scores, the tables are
derived from the declarations, and a new score is one statistic plus one rule."""

from typing import ClassVar

import numpy as np
import pytest
import torch

import attnprobe as ap
from attnprobe.heads import CensusStats, RowBlock, Tally
from attnprobe.heads.label_rules import RULES, rule
from attnprobe.heads.scores import wide_scores
from attnprobe.heads.stats import SCORES, STATS, Column, Stat, score_columns
from attnprobe.heads.stats.base import register_means

SPECIAL = 0


def left_padded_block(seed=0):
    """Two inputs, the second left-padded by 2; ids repeat so every copy pattern exists."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([[SPECIAL, 5, 6, 5, 6, 7, 5], [9, 9, SPECIAL, 8, 8, 3, 8]])
    valid = torch.tensor([[True] * 7, [False, False] + [True] * 5])
    pos = torch.where(valid, valid.long().cumsum(-1) - 1, -1)
    a = torch.rand(2, 3, 7, 7, generator=gen) * valid[:, None, None, :]
    a = a / a.sum(-1, keepdim=True)
    return RowBlock(a, valid, pos.clamp(min=0), pos, valid.sum(-1), query_ids=ids,
                    key_ids=ids)


def copies_by_loop(block, name):
    """(sum of renormalised shares, rows) per head, one row and key at a time."""
    a, ids = block.pattern, block.key_ids
    n_heads = a.shape[1]
    sums, rows = np.zeros(n_heads), np.zeros(n_heads)
    for b in range(a.shape[0]):
        real = [k for k in range(a.shape[3]) if block.key_pos[b, k] >= 0]
        content = [k for k in real if ids[b, k] != SPECIAL]
        pos = {k: int(block.key_pos[b, k]) for k in real}
        for q in real:
            if ids[b, q] == SPECIAL:
                continue

            def hit(k, b=b, q=q, real=real, pos=pos):
                before = [j for j in real if pos[j] == pos[k] - 1]
                follows = bool(before) and ids[b, before[0]] == ids[b, q]
                same = ids[b, k] == ids[b, q]
                d = pos[k] - pos[q]
                return {"prev": d == -1, "duplicate": same and d < 0,
                        "induction": follows and d < -1,
                        "duplicate_ahead": same and d > 0,
                        "induction_ahead": follows and d > 1}[name]

            hits = [k for k in content if hit(k)]
            if not hits:
                continue
            for h in range(n_heads):
                base = float(a[b, h, q, content].sum())
                sums[h] += float(a[b, h, q, hits].sum()) / base
                rows[h] += 1
    return sums, rows


@pytest.mark.parametrize("name", ["prev", "duplicate", "induction", "duplicate_ahead",
                                  "induction_ahead"])
def test_copies_read_at_the_matching_pairs_equal_a_loop_over_rows_and_keys(name):
    block = left_padded_block()
    sums, rows = CensusStats(classes={"special": torch.tensor([SPECIAL])},
                             groups=frozenset({"match"}))(block)[name]
    want_sums, want_rows = copies_by_loop(block, name)
    assert rows.tolist() == want_rows.tolist()
    np.testing.assert_allclose(sums.numpy(), want_sums, rtol=1e-5)


def test_the_wide_table_follows_the_declared_score_order():
    block = left_padded_block()
    tally = Tally()
    stats = CensusStats(classes={"special": torch.tensor([SPECIAL])}, max_offset=4)
    tally.add(("s", "self", 0), (0, 1, 2), block, [stats])
    table = wide_scores(tally)
    scores = [c for c in table.columns if c not in ("stack", "kind", "layer", "head",
                                                    "head_id")]
    declared = list(score_columns())
    assert scores == sorted(scores, key=declared.index)  # every column declared, in order
    assert {"entropy", "prev", "sink", "duplicate", "duplicate_rows"} <= set(scores)


class LastKey(Stat):
    """The mass each row gives its last real key (a test's new statistic)."""

    part: ClassVar[str] = "last"
    columns: ClassVar[tuple[Column, ...]] = (Column("last", "mass on the last real key"),)

    def __call__(self, tile):
        key = (tile.block.key_len - 1).to(tile.device)  # keys are right-aligned here
        at = torch.gather(tile.a, -1, key[:, None, None, None].expand(*tile.a.shape[:3], 1))
        return {"last": tile.block.masked_row_sum(at[..., 0])}


@pytest.fixture
def last_key_score():
    STATS.register("last")(LastKey())
    register_means("last", ("last",), "mass on the last real key", 950)

    @rule("looks_last", rank=0.5, family="positional")
    def looks_last(row, t):
        return f"last={row['last']:.2f} > 0.9" if row.get("last", 0) > 0.9 else None

    yield
    STATS.unregister("last")
    SCORES.unregister("last")
    RULES.remove("looks_last")


def test_a_new_score_is_one_statistic_and_one_rule(last_key_score):
    n = 5
    a = torch.zeros(1, 2, n, n)
    a[0, 0, :, -1] = 1.0  # head 0 looks at the last key
    a[0, 1] = 1 / n
    valid = torch.ones(1, n, dtype=torch.bool)
    pos = torch.arange(n)[None]
    tally = Tally()
    tally.add(("s", "self", 0), (0, 1),
              RowBlock(a, valid, pos, pos, torch.tensor([n])), [CensusStats()])
    table = ap.heads.classify_scores(wide_scores(tally))
    assert table["last"].tolist() == pytest.approx([1.0, 1 / n])
    assert table["label"].tolist()[0] == "looks_last"
    assert table["label"].tolist()[1] != "looks_last"
    assert "last" in score_columns()
