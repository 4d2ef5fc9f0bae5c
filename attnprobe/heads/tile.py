"""One block of attention rows and what the census statistics share, each computed once.

The census reads about thirty numbers per head off every block of weights the capture hands
over (:class:`~attnprobe.core.row_blocks.RowBlock`, ``[batch, head, query, key]``). Computed
one statistic at a time they would cost as much as the forward itself, so each statistic
(:mod:`attnprobe.heads.stats`) reads from one :class:`Tile` whose quantities are computed on
first use and kept: the row entropies and maxima, the weight at each relative offset, the
mass on each token class, the sink keys and the sink-free mass and maximum. Full passes
over the weights: the entropy, the maximum, the column sums (sink candidates), the sink-free
rows, one per-offset sum over the batch (or one gather of every offset near the diagonal),
and the token-class masses (with the attention distance of a causal block of rows). Token
matches (duplicate, induction) are read at the matching pairs only, never through a
``[query, key, pattern]`` tensor. Which keys a row may see is the block's rule
(:func:`attnprobe.core.row_blocks.key_rule`), read from positions, not from the weights.

A block of a long causal input's rows holds only the keys up to its last row (the capture
drops the keys no row of it may see): its statistics of keys after a row — later copies
(``*_ahead``, weight 0 there) and positive offsets — count only what the block holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from attnprobe.core.divergence import entropy
from attnprobe.core.row_blocks import KeyRule, RowBlock, SeenPairs, key_rule
from attnprobe.core.row_max import row_max
from attnprobe.heads.sinks import SinkRule, SinkView, aligned, sink_view

__all__ = ["START_ROLES", "Tile", "TileSpec"]

START_ROLES = ("bos", "cls")  # start tokens: sink keys wherever they stand
ENTROPY_CHUNK = 1 << 18  # weights per chunk of a long block's row entropies (1 MiB float32)


@dataclass(frozen=True, eq=False)
class TileSpec:
    """What the statistics of every tile of one census share.

    Attributes:
        classes: token class -> ids (:func:`attnprobe.core.tokens.token_classes`); empty
            without a tokenizer.
        max_offset: offsets beyond ±max_offset share one ``far`` bin (None: a bin each).
        sinks: how column sinks are found.
        prefix: prepended to the token-match names (``rep_`` for the repeated-token probe).
    """

    classes: dict[str, torch.Tensor] = field(default_factory=dict)
    max_offset: int | None = None
    sinks: SinkRule = field(default_factory=SinkRule)
    prefix: str = ""

    @cached_property
    def start_ids(self) -> torch.Tensor | None:
        starts = [self.classes[role] for role in START_ROLES if role in self.classes]
        return torch.cat(starts) if starts else None

    @cached_property
    def special(self) -> torch.Tensor:
        return self.classes.get("special", torch.empty(0, dtype=torch.long))


class Tile:
    """A block of rows (``a`` ``[batch, head, query, key]`` float32) and its shared
    quantities, each a cached property (module docstring)."""

    def __init__(self, block: RowBlock, spec: TileSpec) -> None:
        self.block = block
        self.spec = spec
        pattern = block.pattern
        self.a = pattern if pattern.dtype == torch.float32 else pattern.float()
        self.device = self.a.device

    # ---------------------------------------------------------------- positions
    @cached_property
    def rows(self) -> torch.Tensor:
        """``[batch, query]`` bool: the valid (real) query rows."""
        return self.block.query_valid.to(self.device)

    @cached_property
    def real(self) -> torch.Tensor:
        """``[batch, key]`` bool: real keys."""
        return self.block.real_keys().to(self.device)

    @cached_property
    def rule(self) -> KeyRule:
        """Which keys a valid row may see (:func:`~attnprobe.core.row_blocks.key_rule`)."""
        return key_rule(self.block)

    @cached_property
    def seen(self) -> SeenPairs:
        """The pairs the block's rows may attend to (counted from positions)."""
        return SeenPairs(self.block, self.rule, self.a)

    @cached_property
    def visible(self) -> torch.Tensor:
        """``[batch, query]`` float32: keys each row may attend to (at least 1)."""
        return self.block.visible_keys().to(self.device, torch.float32)

    @cached_property
    def aligned(self) -> bool:
        """Whether real tokens sit at their own index (offsets are diagonals)."""
        return aligned(self.block)

    @cached_property
    def whole(self) -> bool:
        """Whether the block is whole inputs at their own index (stored maps, the census'
        batches) rather than a block of a longer input's rows (even an aligned first one)."""
        return self.aligned and self.a.shape[-1] >= int(self.block.key_len.max())

    @cached_property
    def rel(self) -> torch.Tensor:
        """``[batch, query, key]`` key position minus query position."""
        block = self.block
        return (block.key_pos[:, None, :] - block.query_pos[:, :, None]).to(self.device)

    @cached_property
    def key_index(self) -> torch.Tensor:
        """``[batch, positions + 1]``: the key index of each real token position (the last
        column, and positions that are no key, hold ``keys``: out of range)."""
        block = self.block
        n_keys = block.key_pos.shape[1]
        width = int(block.key_pos.max()) + 2 if block.key_pos.numel() else 1
        index = torch.full((block.key_pos.shape[0], width), n_keys, dtype=torch.long)
        b, k = (block.key_pos >= 0).nonzero(as_tuple=True)
        index[b, block.key_pos[b, k]] = k
        return index.to(self.device)

    def offset_keys(self, offsets: Sequence[int]) -> torch.Tensor:
        """``[batch, query, offsets]``: the key index at ``query position + offset`` for each
        offset (``keys`` where there is no such real key), in one gather."""
        index = self.key_index
        width = index.shape[1]
        step = torch.as_tensor(list(offsets), dtype=torch.long, device=self.device)
        target = self.block.query_pos.to(self.device)[:, :, None] + step
        target = torch.where(target < 0, width - 1, target.clamp(max=width - 1))
        return torch.gather(index, 1, target.flatten(1)).view(target.shape)

    def offset_key(self, offset: int) -> torch.Tensor:
        """``[batch, query]``: the key index at ``query position + offset``."""
        return self.offset_keys((offset,))[..., 0]

    def at_offsets(self, offsets: Sequence[int], weights: torch.Tensor | None = None
                   ) -> torch.Tensor:
        """``[batch, head, query, offsets]``: the weight each row gives the real key at each
        offset (0 where there is none), of ``weights`` (default the tile's), in one
        gather."""
        w = self.a if weights is None else weights
        batch, n_heads, q_len, k_len = w.shape
        key = self.offset_keys(offsets)  # [batch, query, offsets]
        found = key < k_len
        index = key.clamp(max=k_len - 1)[:, None].expand(batch, n_heads, q_len, key.shape[-1])
        return torch.gather(w, -1, index) * found[:, None]

    def at_offset(self, offset: int, weights: torch.Tensor | None = None) -> torch.Tensor:
        """``[batch, head, query]``: the weight each row gives the real key at ``offset``."""
        return self.at_offsets((offset,), weights)[..., 0]

    def row_sum(self, per_row: torch.Tensor) -> torch.Tensor:
        """``[head]`` float64 sums of ``per_row`` ``[batch, head, query]`` over the valid
        rows."""
        return torch.where(self.rows[:, None, :], per_row, 0.0).sum(dim=(0, 2),
                                                                    dtype=torch.float64)

    @staticmethod
    def row_sums(per_row: Sequence[torch.Tensor], where: torch.Tensor) -> torch.Tensor:
        """``[n, head]`` float64 sums of ``n`` quantities ``[batch, head, query]`` over the
        rows ``where`` marks (``[batch, head|1, query]`` bool), in one reduction (stacked
        on a leading axis: contiguous copies)."""
        stacked = torch.stack(list(per_row))
        return torch.where(where, stacked, 0.0).sum(dim=(1, 3), dtype=torch.float64)

    # --------------------------------------------------------------- row passes
    @cached_property
    def entropy(self) -> torch.Tensor:
        """``[batch, head, query]`` row entropies (nats). Whole inputs (:attr:`whole`) take
        :func:`~attnprobe.core.divergence.entropy`, as stored maps do; a block of a long
        input's rows the vectorised logarithm (``xlogy``'s scalar loop would cost more than
        the attention itself; the two differ in the last bit of some terms), a few rows at a
        time: each chunk's four passes run in cache, and its temporaries are small enough
        to reuse freed memory instead of faulting in fresh pages."""
        if self.whole:
            return entropy(self.a)
        rows = self.a.reshape(-1, self.a.shape[-1])
        out = torch.empty(rows.shape[0], dtype=self.a.dtype, device=self.device)
        step = max(1, ENTROPY_CHUNK // max(1, rows.shape[1]))
        tiny = torch.finfo(self.a.dtype).tiny  # 0 ln 0 = 0
        for start in range(0, rows.shape[0], step):
            part = rows[start:start + step]
            torch.sum(part.clamp(min=tiny).log_().mul_(part), -1, out=out[start:start + step])
        return out.neg_().view(self.a.shape[:-1])

    @cached_property
    def sinks(self) -> SinkView | None:
        """The sink keys of each head and the weights on them (None without a real pair)."""
        if not bool((self.real.any(-1) & self.rows.any(-1)).any()):
            return None
        return sink_view(self.block, self.a, self.spec.start_ids, self.spec.sinks, self.seen)

    @cached_property
    def top(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(max, argmax)`` ``[batch, head, query]`` of every row (the first of equal
        weights)."""
        return row_max(self.a)

    @cached_property
    def top_offset(self) -> torch.Tensor:
        """``[batch, head, query]``: key position minus query position of each row's
        argmax."""
        return self.offset_of(self.top[1])

    def offset_of(self, key: torch.Tensor) -> torch.Tensor:
        """``[batch, head, query]`` relative offset of the key index ``key`` of each row."""
        if self.aligned:
            return key - torch.arange(self.a.shape[2], device=self.device)
        batch, n_heads, q_len = key.shape
        key_pos = torch.gather(self.block.key_pos.to(self.device), 1, key.reshape(batch, -1))
        return key_pos.view(batch, n_heads, q_len) - self.block.query_pos.to(
            self.device)[:, None, :]

    @cached_property
    def free_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(rest, max, argmax)`` ``[batch, head, query]`` of every row over its real keys
        that are no sink key (:meth:`~attnprobe.heads.sinks.SinkView.free_rows`). Whole
        inputs sum the keys left, as stored maps do; a block of a long input's rows takes the
        real mass less the sink keys' (no pass over the block; equal to the last bits)."""
        rest = None if self.whole else \
            (self.row_mass - self.sinks.on_sinks.sum(-1)).clamp(min=0)
        return self.sinks.free_rows(self.a, self.real, self.top, rest)

    @cached_property
    def row_mass(self) -> torch.Tensor:
        """``[batch, head, query]`` each row's mass on the real keys (1 but for edits and
        learned sinks)."""
        return self.class_masses["real"]

    # --------------------------------------------------------------- key classes
    @cached_property
    def content(self) -> torch.Tensor:
        """``[batch, key]`` bool: real keys that are no special token (needs key ids)."""
        k_ids = self.block.require_ids("content-token")[1].to(self.device)
        return self.real & ~torch.isin(k_ids, self.spec.special.to(self.device))

    def key_at(self, keys: torch.Tensor, offset: int) -> torch.Tensor:
        """``[batch, query]`` bool: whether ``keys`` (``[batch, key]`` bool) holds the key at
        ``query position + offset``."""
        padded = torch.nn.functional.pad(keys, (0, 1))  # index ``keys``: no such key
        return torch.gather(padded, 1, self.offset_key(offset))

    def mass_on_pairs(self, pairs: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
        """``[batch, head, query]``: each row's mass on the keys ``pairs`` marks — ``[batch,
        query, key]`` bool, or its ``(batch, query, key)`` indices in that order — read at
        those pairs only (sparse: a token's earlier copies)."""
        b, q, k = pairs.nonzero(as_tuple=True) if isinstance(pairs, torch.Tensor) else pairs
        out = self.a.new_zeros(self.a.shape[0], self.a.shape[2], self.a.shape[1])
        out.index_put_((b, q), self.a[b, :, q, k], accumulate=True)
        return out.transpose(1, 2)

    @cached_property
    def causal_distance(self) -> bool:
        """Whether every key a row sees stands at or before it (causal rules), so the
        attention distance is a product with the key positions (:attr:`class_masses`)."""
        return not self.whole and self.rule.kind in ("causal", "window")

    @cached_property
    def class_masses(self) -> dict[str, torch.Tensor]:
        """``name -> [batch, head, query]`` mass on the real keys (``real``), the first token,
        each token class and the content keys (``content``: real and no special token; the
        classes and content need key ids), in one batched product over the keys; for a
        causal block of rows also ``before``, ``Σ_j a_ij (p_0 - p_j)`` with ``p_0`` each
        input's first row position (the distance is ``(p_i - p_0) real + before``, no
        ``[query, key]`` offsets needed)."""
        block = self.block
        key_pos = block.key_pos.to(self.device)
        features = {"real": self.real, "first": (key_pos == 0) & self.real}
        if block.key_ids is not None:
            k_ids = block.key_ids.to(self.device)
            for name, ids in self.spec.classes.items():
                features[name] = torch.isin(k_ids, ids.to(self.device)) & self.real
            features["content"] = self.content
        stacked = torch.stack(list(features.values()), -1).to(self.a)  # [batch, key, f]
        if self.causal_distance:
            start = self.block.query_pos.to(self.device)[:, :1]
            before = torch.where(self.real, start - key_pos, 0).to(self.a)
            stacked = torch.cat([stacked, before[..., None]], -1)
            features["before"] = self.real
        masses = torch.matmul(self.a, stacked[:, None])  # [batch, head, query, f]
        return {name: masses[..., i] for i, name in enumerate(features)}
