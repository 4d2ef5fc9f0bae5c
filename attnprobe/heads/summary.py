"""Head statistics of maps already in memory, through the same reducers as streaming."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from attnprobe.heads.reducers import Reducer, RowBlock, Tally, default_reducers
from attnprobe.types import AttentionMap


def tally_maps(maps: Sequence[AttentionMap], reducers: Sequence[Reducer] | None = None) -> Tally:
    """Feed stored maps (``[layer, head, query, key]``, no padding) to ``reducers``."""
    reducers = list(reducers) if reducers is not None else default_reducers()
    tally = Tally()
    for amap in maps:
        n_q, n_k = len(amap.query_tokens), len(amap.key_tokens)
        for i, layer in enumerate(amap.layers):
            block = RowBlock(pattern=amap.pattern[i][None],
                             query_valid=torch.ones(1, n_q, dtype=torch.bool),
                             query_pos=torch.arange(n_q)[None],
                             key_pos=torch.arange(n_k)[None],
                             key_len=torch.tensor([n_k]))
            tally.add((amap.stack, amap.kind, layer), amap.heads, block, reducers)
    return tally


def summarize(maps: Sequence[AttentionMap],
              reducers: Sequence[Reducer] | None = None) -> pd.DataFrame:
    """One row per head: entropy, max weight, prev/self/next mass, first-key mass (means
    over every query row of every map)."""
    return tally_maps(maps, reducers).summary()
