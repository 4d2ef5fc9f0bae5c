"""The census's part of a capture: what it takes from each block of rows as the model runs.

One capture is open for a whole corpus (:func:`attnprobe.heads.census`); per forward, this
part (:class:`CensusTap`) reads every block of rows the seam hands over and keeps only what
the census needs:

* the statistics (:class:`~attnprobe.heads.census_stats.CensusStats`). Whole rows of every
  layer of one forward are stacked along the head axis — one group per rule of visible keys
  (:func:`~attnprobe.core.row_blocks.stack_heads`: a sliding-window layer is never read with
  a global layer's rule) — and reduced at the end of the forward: a few large tensor
  operations instead of many small ones per layer. Blocks of rows of a long input are
  reduced as they come, and dropped;
* the rows that the head distances are computed from (``sample_rows`` per forward, evenly
  spaced over its real rows): never the full maps;
* with dependency trees, the padded weights of the main self-attention stack (word-level
  syntax needs every row; the part then asks for whole rows).

:meth:`CensusTap.take` turns what one forward left into mergeable
:class:`~attnprobe.heads.census_sums.CensusSums` (and the padded weights syntax reads).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from attnprobe.capture.calls import BatchPatterns
from attnprobe.capture.parts import Host, Part, Rows
from attnprobe.capture.sites import Site
from attnprobe.core.reducers import Reducer, Tally, reduce_block
from attnprobe.core.row_blocks import RowBlock, TokenView, row_block, stack_heads
from attnprobe.heads.census_sums import CensusSums, StackedSums
from attnprobe.heads.similarity import HeadDistances

__all__ = ["CensusTap", "Forward"]

Group = tuple[str, str, tuple[int, ...]]  # stack, kind, kept weights' shape past the batch


class Forward:
    """What one forward left: whole-row blocks per group of sites (layer order at
    :meth:`CensusTap.take`), sampled rows per site, streamed sums."""

    def __init__(self) -> None:
        self.blocks: dict[Group, dict[Site, RowBlock]] = {}
        self.heads: dict[Site, tuple[int, ...]] = {}
        self.samples: dict[Site, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.chosen: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.key_valid: dict[Site, torch.Tensor] = {}
        self.tally = Tally()


def _sampled(valid: torch.Tensor, max_rows: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(batch, query)`` indices of the rows the distances use: at most ``max_rows`` of the
    real rows ``valid`` ``[batch, query]``, evenly spaced in row-major order."""
    b, q = valid.nonzero(as_tuple=True)
    if max_rows is not None and len(b) > max_rows:
        keep = torch.linspace(0, len(b) - 1, max_rows).round().long()
        b, q = b[keep], q[keep]
    return b, q


class CensusTap(Part):
    """The census's capture part (module docstring).

    Args:
        reducers: the census statistics (:func:`~attnprobe.heads.scores.census_reducers`).
        sample_rows: rows per forward for the head distances (None: every real row; 0: no
            distances).
        keep_main: keep the padded weights of the main self-attention stack (syntax).
    """

    name: ClassVar[str] = "census"

    def __init__(self, reducers: Sequence[Reducer], *, sample_rows: int | None = 16,
                 keep_main: bool = False) -> None:
        self.reducers = tuple(reducers)
        self.sample_rows = sample_rows
        self.keep_main = keep_main
        self.whole_rows = keep_main  # type: ignore[misc]  # per instance: syntax needs maps
        self.now = Forward()

    def on_rows(self, host: Host, rows: Rows) -> None:
        call, site = host.current, rows.site
        pattern = rows.kept.detach()
        if pattern.device.type != "cpu" or pattern.dtype != torch.float32:
            pattern = pattern.to("cpu", torch.float32)  # as kept maps are (sums in float32)
        batch, _, q_block, k_block = pattern.shape
        queries = TokenView(*call.token_view(site.side, batch, rows.q_total))
        keys = TokenView(*call.token_view(site.key_side, batch, rows.k_total or k_block))
        span = slice(rows.q_start, rows.q_start + q_block)
        block = row_block(pattern, queries, keys, rows=span, key_span=rows.keys,
                          visible=rows.visible, learned_sink=site in host.learned_sinks)
        now = self.now
        now.heads[site] = rows.heads
        if q_block == rows.q_total:  # whole rows: stacked with the forward's other layers
            group = (site.stack, site.kind, tuple(pattern.shape[1:]))
            now.blocks.setdefault(group, {})[site] = block
        else:  # a long input's block of rows: reduced now, its sums packed per site
            last = rows.q_start + q_block >= rows.q_total
            now.tally.add(site.key, rows.heads, block, self.reducers, more=not last)
        if self.sample_rows != 0 and site.kind == "self":
            self._sample(site, queries.valid, span, rows.keys, pattern, keys.valid)

    def _sample(self, site: Site, valid: torch.Tensor, span: slice, key_span: slice,
                pattern: torch.Tensor, key_valid: torch.Tensor) -> None:
        """Keep the block's rows among the forward's sampled rows (``[rows, head, key]``
        over every key of the site: keys the block left out hold no weight)."""
        key = (site.stack, valid.shape[1])
        chosen = self.now.chosen.get(key)
        if chosen is None:  # the same rows for every layer of the stack
            chosen = self.now.chosen[key] = _sampled(valid, self.sample_rows)
        b, q = chosen
        inside = (q >= span.start) & (q < span.stop)
        if bool(inside.any()):
            order = inside.nonzero()[:, 0]
            rows = pattern[b[order], :, q[order] - span.start]  # [rows, head, k_block]
            if rows.shape[-1] != key_valid.shape[1]:
                full = rows.new_zeros(*rows.shape[:2], key_valid.shape[1])
                full[..., key_span] = rows
                rows = full
            self.now.samples.setdefault(site, []).append((order, rows))
        self.now.key_valid[site] = key_valid[b]

    def take(self, sentences: int) -> tuple[CensusSums, BatchPatterns | None]:
        """What the forward since the last call left, as mergeable sums, and (with
        ``keep_main``) the padded weights of its first self-attention stack; the tap is then
        ready for the next forward."""
        now, self.now = self.now, Forward()
        sums = CensusSums(tally=now.tally, sentences=sentences)
        main = None
        for (stack, kind, _), by_site in now.blocks.items():
            sites = sorted(by_site, key=lambda s: s.layer)
            blocks = [by_site[s] for s in sites]
            heads = now.heads[sites[0]]
            groups = stack_heads(blocks)
            for members, block in groups:
                layers = tuple(sites[i].layer for i in members)
                stacked = StackedSums(stack, kind, layers, heads,
                                      float(block.query_valid.sum()),
                                      reduce_block(self.reducers, block))
                key = (stack, kind, layers)
                sums.stacked[key] = sums.stacked[key] + stacked if key in sums.stacked \
                    else stacked
            if self.keep_main and kind == "self" and main is None:
                main = _padded(sites, blocks, heads, groups)
        sums.distances = _distances(now)
        return sums, main


def _padded(sites: list[Site], blocks: list[RowBlock], heads: tuple[int, ...],
            groups: list[tuple[list[int], RowBlock]]) -> BatchPatterns:
    """The whole-row blocks of one stack's layers as padded weights ``[batch, layer, head,
    query, key]`` (a view of the stacked block when every layer shares one rule)."""
    first = blocks[0]
    if len(groups) == 1:
        stacked = groups[0][1].pattern
        pattern = stacked.view(stacked.shape[0], len(blocks), -1, *stacked.shape[2:])
    else:
        pattern = torch.stack([b.pattern for b in blocks], 1)
    return BatchPatterns(pattern=pattern,
                         query_valid=first.query_valid, key_valid=first.real_keys(),
                         query_ids=first.query_ids, key_ids=first.key_ids,
                         layers=tuple(s.layer for s in sites), heads=heads,
                         stack=sites[0].stack, kind=sites[0].kind,
                         learned_sink=any(b.learned_sink for b in blocks))


def _distances(now: Forward) -> HeadDistances | None:
    """Head distances over the sampled rows of the first self-attention stack."""
    if not now.samples:
        return None
    stack = next(iter(now.samples)).stack  # the first stack that ran (the encoder's)
    sites = sorted((s for s in now.samples if s.stack == stack), key=lambda s: s.layer)
    rows = []
    for site in sites:
        pieces = now.samples[site]
        order = torch.cat([o for o, _ in pieces])
        taken = torch.cat([r for _, r in pieces])[torch.argsort(order)]  # [rows, head, key]
        rows.append(taken)
    if len({r.shape for r in rows}) > 1:  # layers of their own key count: the first shape
        rows = [r for r in rows if r.shape == rows[0].shape]
        sites = sites[:len(rows)]
    stacked = torch.stack(rows)  # [layer, rows, head, key]
    keys = tuple((site.stack, site.kind, site.layer, head) for site in sites
                 for head in now.heads[site])
    return HeadDistances.from_rows(stacked.permute(0, 2, 1, 3).flatten(0, 1),
                                   now.key_valid[sites[0]], keys)
