"""Head statistics and labels of maps already in memory, through the same reducers as
streaming."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch

from attnprobe.core.reducers import Reducer, Tally, default_reducers
from attnprobe.core.row_blocks import TokenView, row_block
from attnprobe.core.scope import Scope, ScopeLike
from attnprobe.core.tokens import TokenVocabulary
from attnprobe.errors import InputError
from attnprobe.heads.labels import Thresholds, classify_scores
from attnprobe.heads.scores import census_reducers, wide_scores
from attnprobe.types import AttentionMap


def _ids(tokens: Sequence[str], tokenizer: Any) -> torch.Tensor:
    ids = tokenizer.convert_tokens_to_ids(list(tokens))
    return torch.tensor([-1 if i is None else int(i) for i in ids])[None]


def _visible(amap: AttentionMap, n_q: int, n_k: int) -> torch.Tensor:
    """``[1, query]`` keys each row may see: from ``info.causal`` when known, else the keys
    any head gave weight to."""
    if amap.kind == "self" and amap.info.causal is True and n_q == n_k:
        return torch.arange(1, n_q + 1)[None]
    if amap.kind == "cross" or amap.info.causal is False:
        return torch.full((1, n_q), n_k)
    return (amap.pattern > 0).any(0).any(0).sum(-1)[None]


def tally_maps(maps: Sequence[AttentionMap], reducers: Sequence[Reducer] | None = None,
               tokenizer: Any = None) -> Tally:
    """Feed stored maps (``[layer, head, query, key]``, no padding) to ``reducers``.

    ``tokenizer`` turns the stored token strings back into ids for token-aware reducers.

    Example:
        >>> tally = tally_maps(maps)                    # maps: [layer, head, query, key] each
        >>> stored = tally.summary().query("layer == 0")
        >>> streamed = ap.head_stats(model, tok, texts, scope="layer:0").summary()  # the same
        >>> bool(np.allclose(stored["entropy"], streamed["entropy"], atol=1e-5))
        True
    """
    reducers = list(reducers) if reducers is not None else default_reducers()
    tally = Tally()
    for amap in maps:
        n_q, n_k = len(amap.query_tokens), len(amap.key_tokens)
        queries = _tokens(amap.query_tokens, tokenizer)
        keys = _tokens(amap.key_tokens, tokenizer)
        visible = _visible(amap, n_q, n_k)
        for i, layer in enumerate(amap.layers):
            block = row_block(amap.pattern[i][None], queries, keys, visible=visible,
                              learned_sink=amap.learned_sink)
            tally.add((amap.stack, amap.kind, layer), amap.heads, block, reducers)
    return tally


def _tokens(tokens: Sequence[str], tokenizer: Any) -> TokenView:
    """A stored map's side: every token real, at its own position (ids with a
    tokenizer)."""
    n = len(tokens)
    return TokenView(torch.ones(1, n, dtype=torch.bool), torch.arange(n)[None],
                     None if tokenizer is None else _ids(tokens, tokenizer))


def in_scope(table: pd.DataFrame, scope: ScopeLike) -> pd.DataFrame:
    """The rows of ``table`` (with ``layer`` and ``head`` columns) whose head ``scope`` holds.

    Maps keep the smallest ``layers × heads`` grid holding their scope (``heads:0.2,1.8``
    keeps L0H8 and L1H2 too), so every table made from them is cut back to the scope."""
    scope = Scope.parse(scope)
    if scope.is_all or table.empty:
        return table
    return table[scope.mask(table["layer"], table["head"])].reset_index(drop=True)


def summarize(maps: Sequence[AttentionMap], reducers: Sequence[Reducer] | None = None, *,
              scope: ScopeLike = None) -> pd.DataFrame:
    """One row per head: entropy, max weight, prev/self/next mass, first-key mass (means
    over every query row of every map); only the heads of ``scope`` (default: every head
    the maps hold).

    Example:
        >>> table = summarize(maps)
        >>> len(table), list(table.columns[5:])         # 6 layers × 12 heads
        (72, ['entropy', 'max_weight', 'prev', 'self', 'next', 'key[0]'])
        >>> bool(table["entropy"].le(np.log(10)).all())  # rows of at most 10 keys: ≤ ln 10
        True
        >>> summarize(maps, scope="L0H2")["head_id"].tolist()
        ['L0H2']
    """
    return in_scope(tally_maps(maps, reducers).summary(), scope)


def classify(maps: Sequence[AttentionMap] | Any, *, tokenizer: Any = None,
             thresholds: Thresholds | None = None, window: int = 3) -> pd.DataFrame:
    """Label every head of stored maps (or of a :class:`~attnprobe.heads.head_census.Census`).

    Returns one row per head: ``stack, kind, layer, head, head_id, label, family, evidence,
    also`` and every score (see :mod:`attnprobe.heads.scores`), computed by the census'
    reducer, so the labels are the census' (sink keys included; the ``rep_*`` probe scores need
    a model and are absent, so the copying labels read the maps' own copies over enough rows:
    :mod:`attnprobe.heads.labels`). Without ``tokenizer`` the special tokens are recognised by their
    usual spellings (``[CLS]``, ``<s>`` ...).

    Example:
        >>> labels = classify(maps, tokenizer=tok)
        >>> len(labels), list(labels.columns[:9])       # 6 layers × 12 heads
        (72, ['stack', 'kind', 'layer', 'head', 'head_id', 'label', 'family', 'evidence', 'also'])
        >>> labels["label"].value_counts()
    """
    if hasattr(maps, "classify") and not isinstance(maps, Sequence):
        return maps.classify(thresholds)
    maps = list(maps)
    if not maps:
        raise InputError("no attention maps given")
    if not all(isinstance(m, AttentionMap) for m in maps):
        raise InputError("classify takes AttentionMap objects (e.g. from ap.extract) or a Census")
    vocab = tokenizer if tokenizer is not None else TokenVocabulary(
        t for m in maps for t in (*m.query_tokens, *m.key_tokens))
    tally = tally_maps(maps, census_reducers(vocab), tokenizer=vocab)
    return classify_scores(wide_scores(tally, window=window), thresholds)
