"""One producer of row blocks, with one rule for which keys a row may see.

Every reader of attention rows builds its :class:`RowBlock` here (defined here too):
the capture's streaming part (:class:`~attnprobe.capture.parts.Reduce`, also behind
retrieval), the census, and summaries of stored maps. They hand over what they know — the
weights ``[batch, head, rows, keys]``, each side's tokens (:class:`TokenView`), which rows
and keys the block holds, and the keys each row may attend to as the model's mask says
(``visible``) — and get the same block, so they agree on padding, causal and sliding-window
masks.

**The rule** (:class:`KeyRule`, :func:`key_rule`): a row may attend to the real keys its mask
opens. The mask's counts (``visible``) say how many; they are read as a structure when they
match one — every real key (bidirectional), the keys up to the row's own position (causal),
or the last ``w`` of those (a sliding window) — so the pairs a row sees
(:func:`seen_pairs`) come from positions, never from a pass over the weights. Counts that
match none (e.g. a mask built by hand) fall back to the keys some head gave weight to, and so
do blocks whose seam could not read a mask (``visible=None``: estimated from the weights once,
here).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeVar

import torch

from attnprobe.core.display import counted, describe
from attnprobe.errors import InputError

__all__ = ["KeyRule", "RowBlock", "SeenPairs", "TokenView", "key_rule", "row_block",
           "seen_pairs", "stack_heads", "visible_from_weights"]

RuleKind = Literal["all", "causal", "window", "weights"]
T = TypeVar("T")


@dataclass(frozen=True)
class RowBlock:
    """A block of attention rows of one layer, with what is needed to skip padding.

    Shapes:
        pattern: ``[batch, head, query_block, key]`` post-softmax weights.
        query_valid: ``[batch, query_block]`` bool, False on padding rows.
        query_pos: ``[batch, query_block]`` position of each row among the real query tokens.
        key_pos: ``[batch, key]`` position of each key among the real key tokens, -1 on padding.
        key_len: ``[batch]`` number of real keys.
        visible: ``[batch, query_block]`` number of keys each row may attend to (causal and
            sliding-window masks make this smaller than ``key_len``); ``None`` = all real keys.
        query_ids / key_ids: ``[batch, query_block]`` / ``[batch, key]`` token ids, or ``None``
            when the model was not called with token ids.
        learned_sink: the heads give part of each row's mass to a learned sink (a logit with
            no key, GPT-OSS), so rows sum to at most 1 and the rest counts as sink mass.
    """

    pattern: torch.Tensor
    query_valid: torch.Tensor
    query_pos: torch.Tensor
    key_pos: torch.Tensor
    key_len: torch.Tensor
    visible: torch.Tensor | None = None
    query_ids: torch.Tensor | None = None
    key_ids: torch.Tensor | None = None
    learned_sink: bool = False
    # what the reducers of this block derive from it, made once (e.g. the census
    # statistics' Tile, read by every simple reducer that is a view of them)
    memo: dict[Hashable, Any] = field(default_factory=dict, init=False, compare=False,
                                      repr=False)

    def shared(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``, called once per block and ``key``: a quantity several reducers of the
        block read (the first reducer pays for it, the others reuse it)."""
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    def masked_row_sum(self, per_row: torch.Tensor) -> torch.Tensor:
        """Sum ``[batch, head, query_block]`` values over valid rows -> ``[head]`` float64."""
        valid = self.query_valid[:, None, :].to(per_row.device)
        kept = torch.where(valid, per_row, 0.0)  # padding rows may hold NaN
        return kept.sum(dim=(0, 2), dtype=torch.float64)  # float64 on the fly: no copy

    def visible_keys(self) -> torch.Tensor:
        """``[batch, query_block]`` keys each row may attend to (at least 1)."""
        if self.visible is None:
            return self.key_len[:, None].expand_as(self.query_pos)
        return self.visible.clamp(min=1)

    def real_keys(self) -> torch.Tensor:
        """``[batch, key]`` bool: the key is a real token."""
        return self.key_pos >= 0

    def __repr__(self) -> str:
        batch, heads, rows, keys = self.pattern.shape
        return describe("RowBlock", f"{counted(batch, 'example')} × {counted(heads, 'head')} × "
                        f"{counted(rows, 'query row')} × {counted(keys, 'key')}",
                        f"{counted(int(self.query_valid.sum()), 'real row')}",
                        "token ids" if self.key_ids is not None else "no token ids")

    def require_ids(self, reducer: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Query and key token ids, or a clear error naming the reducer that needs them."""
        if self.query_ids is None or self.key_ids is None:
            raise InputError(f"the {reducer} statistic needs token ids: call the model with "
                             "input_ids inside the capture (or pass token ids to tally_maps)")
        return self.query_ids, self.key_ids


class TokenView(NamedTuple):
    """One side's tokens over its full length: ``valid`` ``[batch, n]`` bool (False on
    padding), ``pos`` ``[batch, n]`` position among the real tokens (-1 on padding) and
    ``ids`` ``[batch, n]`` (None when unknown)."""

    valid: torch.Tensor
    pos: torch.Tensor
    ids: torch.Tensor | None


@dataclass(frozen=True)
class KeyRule:
    """Which real keys a valid row may attend to: ``all`` of them, the ``causal`` ones (key
    position <= the row's), a causal ``window`` of the last ``window`` keys, or — counts that
    match no structure — the keys some head gave ``weights`` to."""

    kind: RuleKind
    window: int = 0

    def seen(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
        """``[batch, query, key]`` bool for the structured rules (padding aside)."""
        if self.kind == "all":
            return torch.ones(query_pos.shape[0], query_pos.shape[1], key_pos.shape[1],
                              dtype=torch.bool, device=query_pos.device)
        ahead = key_pos[:, None, :] - query_pos[:, :, None]  # [batch, query, key]
        if self.kind == "causal":
            return ahead <= 0
        return (ahead <= 0) & (ahead > -self.window)


def key_rule(block: RowBlock) -> KeyRule:
    """The block's rule (module docstring), read from its ``visible`` counts on its valid
    rows."""
    rows = block.query_valid
    if block.visible is None:
        return KeyRule("all")
    visible = block.visible.to(rows.device)
    if bool(((visible == block.key_len[:, None]) | ~rows).all()):
        return KeyRule("all")
    causal = block.query_pos + 1
    if bool(((visible == causal) | ~rows).all()):
        return KeyRule("causal")
    short = rows & (visible < causal)  # a window binds on these rows
    if bool(short.any()):
        window = int(visible[short].max())
        if bool(((visible == causal.clamp(max=window)) | ~rows).all()):
            return KeyRule("window", window)
    return KeyRule("weights")


def seen_pairs(block: RowBlock, a: torch.Tensor | None = None,
               rule: KeyRule | None = None) -> torch.Tensor:
    """``[batch, query, key]`` bool: the (valid) row may attend to the (real) key, by
    :func:`key_rule` (``a``, the weights ``[batch, head, query, key]``, only for counts that
    match no structure; default the block's)."""
    a = block.pattern if a is None else a
    device = a.device
    rule = key_rule(block) if rule is None else rule
    real = block.real_keys().to(device)[:, None, :] & block.query_valid.to(device)[:, :, None]
    if rule.kind == "all":
        return real
    if rule.kind == "weights":
        return real & (a > 0).any(1)
    return real & rule.seen(block.query_pos.to(device), block.key_pos.to(device))


class SeenPairs:
    """The pairs of one block its rows may see (:func:`seen_pairs`), counted without the
    ``[batch, query, key]`` tensor when the rule is a structure (a long block of rows of a
    causal model would otherwise hold one more such tensor per block)."""

    def __init__(self, block: RowBlock, rule: KeyRule, a: torch.Tensor | None = None) -> None:
        self.block, self.rule = block, rule
        self.a = block.pattern if a is None else a
        device = self.a.device
        self.rows = block.query_valid.to(device)
        self.real = block.real_keys().to(device)
        self.query_pos = block.query_pos.to(device)
        self.key_pos = block.key_pos.to(device)
        self._pairs: torch.Tensor | None = None

    @property
    def pairs(self) -> torch.Tensor:
        """``[batch, query, key]`` bool (built on first use)."""
        if self._pairs is None:
            self._pairs = seen_pairs(self.block, self.a, self.rule)
        return self._pairs

    def per_row(self) -> torch.Tensor:
        """``[batch, query]`` keys each valid row sees (0 for padding rows)."""
        if self.rule.kind == "weights":
            return self.pairs.sum(-1)
        if self.rule.kind == "all":
            return self.real.sum(-1)[:, None] * self.rows
        ahead = self.query_pos + 1 if self.rule.kind == "causal" else \
            (self.query_pos + 1).clamp(max=self.rule.window)
        return ahead.clamp(min=0) * self.rows

    def per_key(self) -> torch.Tensor:
        """``[batch, key]`` valid rows that see each real key."""
        if self.rule.kind == "weights":
            return self.pairs.sum(1)
        n_rows = self.rows.sum(-1, keepdim=True)
        if self.rule.kind == "all":
            return n_rows * self.real
        # rows at or after the key (and, in a window, before key + window): binary search
        # in the rows' sorted positions (padding rows sort last)
        big = torch.iinfo(torch.long).max
        ordered = torch.where(self.rows, self.query_pos, big).sort(-1).values
        key_pos = self.key_pos.contiguous()
        count = n_rows - torch.searchsorted(ordered, key_pos)
        if self.rule.kind == "window":
            count = count - (n_rows - torch.searchsorted(ordered, key_pos + self.rule.window))
        return count * self.real

    def columns(self, b: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``[n, query]`` bool: the rows that see key ``k[i]`` of input ``b[i]``."""
        if self.rule.kind == "weights":
            return self.pairs[b, :, k]
        seen = self.rows[b] & self.real[b, k][:, None]
        if self.rule.kind == "all":
            return seen
        ahead = self.key_pos[b, k][:, None] - self.query_pos[b]
        seen = seen & (ahead <= 0)
        return seen & (ahead > -self.rule.window) if self.rule.kind == "window" else seen


def visible_from_weights(pattern: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """``[batch, rows]`` real keys some head gave weight to: a seam that cannot read the mask
    (exact unless every head's weight on an open key underflows)."""
    seen = (pattern.detach() > 0).any(1) & key_valid[:, None, :].to(pattern.device)
    return seen.sum(-1)


def row_block(pattern: torch.Tensor, queries: TokenView, keys: TokenView, *,
              rows: slice | None = None, key_span: slice | None = None,
              visible: torch.Tensor | None = None, learned_sink: bool = False) -> RowBlock:
    """The block of ``pattern`` ``[batch, head, rows, keys]``: query rows ``rows`` and keys
    ``key_span`` (default all) of the sides ``queries`` / ``keys`` (:class:`TokenView`, full
    length); ``visible`` ``[batch|1, rows]`` the keys each row's mask opens (None: read from
    the weights, :func:`visible_from_weights`)."""
    rows = slice(0, queries.valid.shape[1]) if rows is None else rows
    key_span = slice(0, keys.valid.shape[1]) if key_span is None else key_span
    batch, n_rows = pattern.shape[0], pattern.shape[2]
    k_valid = keys.valid[:, key_span]
    if visible is None:
        visible = visible_from_weights(pattern, k_valid)
    return RowBlock(pattern=pattern, query_valid=queries.valid[:, rows],
                    query_pos=queries.pos[:, rows], key_pos=keys.pos[:, key_span],
                    key_len=keys.valid.sum(-1).clamp(min=1),
                    visible=visible.expand(batch, n_rows).cpu(),
                    query_ids=None if queries.ids is None else queries.ids[:, rows],
                    key_ids=None if keys.ids is None else keys.ids[:, key_span],
                    learned_sink=learned_sink)


def stack_heads(blocks: Sequence[RowBlock]) -> list[tuple[list[int], RowBlock]]:
    """Blocks of the same rows and keys (e.g. every layer of one forward) stacked along the
    head axis, one block per group that shares the rule (equal ``visible`` counts and learned
    sink): a few large tensor operations instead of many small ones per layer. Returns
    ``(indices into blocks, stacked block)`` per group, in first-seen order."""
    groups: list[tuple[list[int], RowBlock]] = []
    for i, block in enumerate(blocks):
        for members, first in groups:
            if first.learned_sink == block.learned_sink and (
                    first.visible is block.visible or (
                        first.visible is not None and block.visible is not None
                        and torch.equal(first.visible, block.visible))):
                members.append(i)
                break
        else:
            groups.append(([i], block))
    out = []
    for members, first in groups:
        pattern = first.pattern if len(members) == 1 else \
            torch.cat([blocks[i].pattern for i in members], 1)
        out.append((members, RowBlock(pattern, first.query_valid, first.query_pos,
                                      first.key_pos, first.key_len, first.visible,
                                      first.query_ids, first.key_ids, first.learned_sink)))
    return out
