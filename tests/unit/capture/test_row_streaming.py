"""Streamed blocks of rows hold only the keys their rows may see, and the tally they give is
the whole rows' tally (tiny Mistral: causal, a sliding window of 4, padding)."""

from __future__ import annotations

import pytest
import torch

import attnprobe as ap
from attnprobe.capture import Reduce, parts
from attnprobe.heads.scores import census_reducers
from tests.integration.hf_models import build
from tests.unit.capture.tiny import batch

ROW_STATISTICS = ("entropy", "entropy_norm", "chance_weight", "max_weight", "distance",
                  "first", "prev")


@pytest.fixture
def blocks(monkeypatch):
    """``(first row, rows, first key, keys, key total)`` of each block Reduce receives."""
    seen = []
    on_rows = parts.Reduce.on_rows

    def record(self, host, rows):
        seen.append((rows.q_start, rows.pattern.shape[2], rows.k_start, rows.pattern.shape[3],
                     rows.k_total))
        return on_rows(self, host, rows)

    monkeypatch.setattr(parts.Reduce, "on_rows", record)
    return seen


@pytest.mark.parametrize(("lengths", "window"), [((9,), 4), ((9, 6), 4)])
def test_streamed_blocks_drop_the_keys_their_rows_cannot_see(blocks, lengths, window):
    model = build("mistral")  # sliding window 4: row i sees keys i-3 .. i
    inputs = batch("mistral", lengths)
    reducers = census_reducers(None, max_offset=None)
    with torch.no_grad(), ap.capture(model, parts=[Reduce(reducers)]) as whole:
        model(**inputs)
    assert all(n_rows == 9 for _, n_rows, _, _, _ in blocks)  # short: whole rows
    blocks.clear()
    with torch.no_grad(), ap.capture(model, parts=[Reduce(reducers, query_block=2)]) as cut:
        model(**inputs)
    for start, n_rows, k_start, n_keys, k_total in blocks:
        assert k_total == 9 and k_start + n_keys <= start + n_rows  # nothing after its rows
        assert k_start >= max(0, start - window + 1)  # nothing before the window
        assert n_keys < 9 or start + n_rows == 9
    a, b = whole.tally.to_frame(), cut.tally.to_frame()
    merged = a.merge(b, on=["layer", "head", "statistic"], suffixes=("", "_cut"))
    # the statistics of each row alone (sink columns are found per block; later copies and
    # far offsets need keys the block has not)
    kept = merged[merged["statistic"].isin(ROW_STATISTICS)]
    assert set(kept["statistic"]) == set(ROW_STATISTICS)
    assert torch.allclose(torch.tensor(kept["value"].values),
                          torch.tensor(kept["value_cut"].values), atol=1e-5)
