"""One producer of row blocks and one rule for which keys a row may see; packed tallies."""

import pytest
import torch

from attnprobe.core.reducers import Tally
from attnprobe.core.row_blocks import (
    KeyRule,
    RowBlock,
    SeenPairs,
    TokenView,
    key_rule,
    row_block,
    seen_pairs,
    stack_heads,
)


def _block(visible, n=6, valid=None, pattern=None):
    valid = torch.ones(1, n, dtype=torch.bool) if valid is None else valid
    pos = torch.where(valid, valid.long().cumsum(-1) - 1, -1)
    pattern = torch.rand(1, 2, n, n) if pattern is None else pattern
    return RowBlock(pattern, valid, pos, pos, valid.sum(-1), visible=visible)


def _by_loop(rule, n):
    """Which keys row i sees, one pair at a time."""
    seen = torch.zeros(1, n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            seen[0, i, j] = rule == "all" or (j <= i and (rule == "causal" or i - j < 3))
    return seen


@pytest.mark.parametrize(("rule", "visible"), [
    ("all", torch.full((1, 6), 6)),
    ("causal", torch.arange(1, 7)[None]),
    ("window", torch.arange(1, 7).clamp(max=3)[None]),  # a sliding window of 3 keys
])
def test_the_rule_is_read_from_the_mask_counts_and_gives_the_pairs(rule, visible):
    block = _block(visible)
    assert key_rule(block) == KeyRule(rule, 3 if rule == "window" else 0)
    expected = _by_loop(rule, 6)
    assert torch.equal(seen_pairs(block), expected)
    seen = SeenPairs(block, key_rule(block))  # counted without the pairs
    assert torch.equal(seen.per_row(), expected.sum(-1))
    assert torch.equal(seen.per_key(), expected.sum(1))
    b, k = torch.tensor([0, 0]), torch.tensor([1, 4])
    assert torch.equal(seen.columns(b, k), expected[b, :, k])


def test_counts_matching_no_structure_fall_back_to_the_weights():
    pattern = torch.rand(1, 2, 4, 4)
    pattern[..., 2] = 0.0  # no head looks at key 2
    block = _block(torch.tensor([[3, 3, 3, 3]]), n=4, pattern=pattern)
    assert key_rule(block).kind == "weights"
    expected = torch.ones(1, 4, 4, dtype=torch.bool)
    expected[..., 2] = False
    assert torch.equal(seen_pairs(block), expected)


def test_padding_rows_do_not_decide_the_rule():
    valid = torch.tensor([[True, True, True, False]])  # right padding: its row sees anything
    block = _block(torch.tensor([[1, 2, 3, 1]]), n=4, valid=valid)
    assert key_rule(block).kind == "causal"
    assert not seen_pairs(block)[0, 3].any()  # a padding row sees nothing


def test_a_block_of_rows_and_keys_is_cut_from_each_sides_tokens():
    valid = torch.tensor([[False, True, True, True, True]])  # left padding
    pos = torch.where(valid, valid.long().cumsum(-1) - 1, -1)
    ids = torch.arange(5)[None] + 10
    side = TokenView(valid, pos, ids)
    pattern = torch.rand(1, 2, 2, 3)
    block = row_block(pattern, side, side, rows=slice(3, 5), key_span=slice(1, 4),
                      visible=torch.tensor([[3, 4]]))
    assert block.query_pos.tolist() == [[2, 3]] and block.key_pos.tolist() == [[0, 1, 2]]
    assert block.query_ids.tolist() == [[13, 14]] and block.key_ids.tolist() == [[11, 12, 13]]
    assert block.key_len.tolist() == [4]  # every real key, not only the block's
    assert block.visible.tolist() == [[3, 4]]


def test_without_mask_counts_the_keys_come_from_every_heads_weights():
    side = TokenView(torch.ones(1, 3, dtype=torch.bool), torch.arange(3)[None], None)
    pattern = torch.tensor([[[[1.0, 0, 0], [0.5, 0.5, 0], [0, 0, 1.0]],
                             [[1.0, 0, 0], [0.5, 0.5, 0], [0.5, 0.5, 0]]]])
    assert row_block(pattern, side, side).visible.tolist() == [[1, 2, 3]]


def test_layers_stack_only_with_the_same_rule():
    causal, window = torch.arange(1, 7)[None], torch.arange(1, 7).clamp(max=3)[None]
    blocks = [_block(causal), _block(window), _block(causal.clone())]
    groups = stack_heads(blocks)
    assert [members for members, _ in groups] == [[0, 2], [1]]
    stacked = groups[0][1]
    assert torch.equal(stacked.pattern, torch.cat([blocks[0].pattern, blocks[2].pattern], 1))
    assert key_rule(groups[1][1]) == KeyRule("window", 3)


def test_blocks_of_a_site_packed_add_up_to_the_same_tally():
    site = ("", "self", 0)
    blocks = [{"a": torch.tensor([1.0, 2.0]), "b": (torch.tensor([3.0, 4.0]),
                                                    torch.tensor([1.0, 1.0]))},
              {"a": torch.tensor([0.5, 0.5]), "c": torch.tensor([7.0, 8.0])},  # other stats
              {"b": (torch.tensor([1.0, 1.0]), torch.tensor([2.0, 0.0]))}]
    packed, direct = Tally(), Tally()
    for i, sums in enumerate(blocks):
        assert packed.add_sums(site, (0, 1), 2.0, sums, more=i < len(blocks) - 1)
        direct.add_sums(site, (0, 1), 2.0, sums)
    assert packed.to_frame().equals(direct.to_frame())
    frame = packed.to_frame().set_index(["statistic", "head"])
    assert frame.loc[("a", 1), "sum"] == 2.5 and frame.loc[("b", 0), "count"] == 3.0
    assert not Tally().add_sums(site, (0,), 1.0, {"a": torch.tensor([float("nan")])})
