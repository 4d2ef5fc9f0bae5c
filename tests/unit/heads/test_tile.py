"""The tile's shared quantities equal their definitions, computed the slow way here."""

import torch

from attnprobe.core.divergence import entropy
from attnprobe.core.row_blocks import RowBlock
from attnprobe.heads.census_stats import CensusStats
from attnprobe.heads.stats.copies import matching_pairs
from attnprobe.heads.tile import Tile, TileSpec


def test_matching_pairs_are_every_equal_pair_in_row_major_order():
    gen = torch.Generator().manual_seed(0)
    query = torch.randint(0, 5, (3, 7), generator=gen)
    key = torch.randint(0, 5, (3, 9), generator=gen)
    query[0, 2] = -2  # negative codes match nothing
    key[1, :4] = -1
    expected = ((query[:, :, None] == key[:, None, :]) & (key[:, None, :] >= 0)
                & (query[:, :, None] >= 0)).nonzero(as_tuple=True)
    found = matching_pairs(query, key)
    assert all(torch.equal(a, b) for a, b in zip(found, expected, strict=True))


def _causal_rows(n=40, start=24, seed=1):
    """Rows ``start..n-1`` of a causal input (keys 0..n-1; later keys masked), as a long
    input's block of rows holds them."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(1, 3, n, n, generator=gen) * 3
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    a = scores.softmax(-1)[:, :, start:]
    rows = torch.arange(start, n)[None]
    return RowBlock(a, torch.ones(1, n - start, dtype=torch.bool), rows, torch.arange(n)[None],
                    torch.tensor([n]), visible=rows + 1)


def test_a_causal_block_of_rows_reads_offsets_and_distances_from_positions():
    block = _causal_rows()
    tile = Tile(block, TileSpec())
    assert not tile.aligned and tile.causal_distance
    offsets = (-3, -1, 0, 2)
    at = tile.at_offsets(offsets)
    for i, d in enumerate(offsets):
        for q in range(block.pattern.shape[2]):
            key = int(block.query_pos[0, q]) + d
            want = block.pattern[0, :, q, key] if 0 <= key < 40 else torch.zeros(3)
            assert torch.equal(at[0, :, q, i], want)
    rel = (block.key_pos[:, None, :] - block.query_pos[:, :, None]).abs().float()
    expected = (block.pattern * rel[:, None]).sum((0, 2, 3), dtype=torch.float64)
    distance = CensusStats(groups=frozenset({"offsets"}))(block)["distance"]
    assert torch.allclose(distance, expected, rtol=1e-5)
    assert torch.allclose(tile.entropy, entropy(block.pattern), atol=1e-6)  # vectorised log
