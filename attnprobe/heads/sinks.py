"""Sink keys: where a head parks the mass it does not use.

Most heads of trained models put much of their mass on a few *sink* keys — the first token,
BOS/CLS, a ``[SEP]`` or ``.`` that every row looks at — and do something with the rest (Xiao et
al. 2023; Gu et al. 2024). A head is therefore judged on the mass left after its sink keys,
renormalised; the sink mass is a score of its own.

**Sink keys** of a row, per sequence and head:

* the first real token (Xiao et al.'s attention sink; Gu et al.'s ``k = 1``);
* the tokenizer's start tokens, roles ``bos`` and ``cls`` (:func:`attnprobe.core.tokens.
  token_classes`), wherever they stand;
* **column sinks**: keys that take more than ``epsilon`` of the mass (Gu et al.'s ε = 0.3) in
  more than ``share`` (half) of the rows that may attend to them, when at least ``min_rows``
  rows may (the last keys of a causal model are seen by one or two rows: a self-attending head
  would otherwise make every sequence's last key a column).

Columns are found among the rows a reducer sees at once: every row of a sequence in the census
and in stored maps, except when a streamed input is longer than one block of rows (16 MiB of
weights), where each block of rows finds its own.

The statistics judged on the mass left after the sink keys (``sink``, ``rest``,
``*_nosink``) are :mod:`attnprobe.heads.stats.sinks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnprobe.core.row_blocks import RowBlock, SeenPairs, seen_pairs
from attnprobe.core.row_max import row_max
from attnprobe.errors import InputError

__all__ = ["SinkRule", "SinkView", "aligned", "pairs_seen", "sink_keys", "sink_view"]


@dataclass(frozen=True)
class SinkRule:
    """How column sinks are found (module docstring).

    Attributes:
        epsilon: a key takes "a sink's share" of a row above this mass (Gu et al.'s ε).
        share: ... in more than this fraction of the rows that may attend to it ...
        min_rows: ... and at least this many rows may attend to it.
    """

    epsilon: float = 0.3
    share: float = 0.5
    min_rows: int = 4

    def __post_init__(self) -> None:
        for name in ("epsilon", "share"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 <= value < 1:
                raise InputError(f"sink rule {name} must be in [0, 1), got {value!r}")
        if isinstance(self.min_rows, bool) or not isinstance(self.min_rows, int) \
                or self.min_rows < 1:
            raise InputError(f"sink rule min_rows must be a positive integer, "
                             f"got {self.min_rows!r}")


def pairs_seen(block: RowBlock, a: torch.Tensor) -> torch.Tensor:
    """``[batch, query, key]`` bool: the (valid) row may attend to the (real) key, by the
    block's rule (:func:`attnprobe.core.row_blocks.seen_pairs`)."""
    return seen_pairs(block, a)


def sink_keys(block: RowBlock, a: torch.Tensor, seen: torch.Tensor | SeenPairs,
              start_ids: torch.Tensor | None, rule: SinkRule
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fixed [batch, key], sinks [batch, head, key])`` bool: the first token and start
    tokens, and every sink key of each head (those plus its column sinks).

    ``a`` ``[batch, head, query, key]``; ``seen`` the pairs the rows see (:func:`pairs_seen`
    or a :class:`~attnprobe.core.row_blocks.SeenPairs`); ``start_ids``: ids of the start
    tokens (None or empty: only the first token is fixed).
    """
    if isinstance(seen, torch.Tensor):
        seen = _Given(seen)
    device = a.device
    real = block.real_keys().to(device)
    fixed = (block.key_pos.to(device) == 0) & real
    if start_ids is not None and start_ids.numel() and block.key_ids is not None:
        fixed = fixed | (torch.isin(block.key_ids.to(device), start_ids.to(device)) & real)
    seers = seen.per_key()  # [batch, key]
    # More than share·seers rows above epsilon needs a column sum above epsilon·share·seers,
    # so one cheap pass finds the few candidates (the sum over every row, padding rows
    # included, can only overestimate) and only their columns are counted exactly.
    column_sum = torch.nansum(a, 2)  # [batch, head, key]
    candidate = (column_sum > rule.epsilon * rule.share * seers[:, None, :]) \
        & ((seers >= rule.min_rows) & real & ~fixed)[:, None, :]
    b, h, k = candidate.nonzero(as_tuple=True)
    column = torch.zeros_like(candidate)
    if len(b):
        hits = ((a[b, h, :, k] > rule.epsilon) & seen.columns(b, k)).sum(-1)  # [candidates]
        ok = hits > rule.share * seers[b, k]
        column[b[ok], h[ok], k[ok]] = True
    return fixed, column | (fixed[:, None, :] & real[:, None, :])


class _Given:
    """A ``[batch, query, key]`` tensor of seen pairs, read as :class:`SeenPairs` is."""

    def __init__(self, pairs: torch.Tensor) -> None:
        self.pairs = pairs

    def per_row(self) -> torch.Tensor:
        return self.pairs.sum(-1)

    def per_key(self) -> torch.Tensor:
        return self.pairs.sum(1)

    def columns(self, b: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return self.pairs[b, :, k]


def _sink_columns(sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index, used)`` ``[batch, head, m]``: the key index of each head's sink keys in
    ascending order, padded to the most any head has (``used`` False on the padding)."""
    count = sinks.sum(-1)  # [batch, head]
    width = max(int(count.max()), 1)
    b, h, k = sinks.nonzero(as_tuple=True)  # row-major: keys ascending within a head
    slot = torch.arange(len(k), device=sinks.device) - \
        (count.flatten().cumsum(0) - count.flatten())[b * sinks.shape[1] + h]
    index = torch.zeros(*sinks.shape[:2], width, dtype=torch.long, device=sinks.device)
    index[b, h, slot] = k
    return index, torch.arange(width, device=sinks.device) < count[..., None]


def aligned(block: RowBlock) -> bool:
    """Whether real tokens sit at their own index (right padding, no cache, one block of all
    rows): then offsets are diagonals of the weights."""
    q_len, k_len = block.pattern.shape[2], block.pattern.shape[3]
    if q_len != k_len:
        return False
    index = torch.arange(q_len)
    return bool(((block.query_pos == index) | ~block.query_valid).all()
                and ((block.key_pos == index) | (block.key_pos < 0)).all())


@dataclass(frozen=True, eq=False)
class SinkView:
    """One block's weights split at its sink keys (shapes ``[batch, head, ...]``).

    Attributes:
        fixed: ``[batch, key]`` first token and start tokens.
        sinks: ``[batch, head, key]`` every sink key of each head.
        index / used: ``[batch, head, m]`` the sink keys' indices, padded (``used`` False).
        on_sinks: ``[batch, head, query, m]`` the weights on them (0 on the padding).
        seen: the pairs the block's rows may attend to (a
            :class:`~attnprobe.core.row_blocks.SeenPairs`, or a ``[batch, query, key]`` bool
            tensor from :func:`pairs_seen`).
    """

    fixed: torch.Tensor
    sinks: torch.Tensor
    index: torch.Tensor
    used: torch.Tensor
    on_sinks: torch.Tensor
    seen: SeenPairs | torch.Tensor

    def is_sink(self, key: torch.Tensor) -> torch.Tensor:
        """``[batch, head, query]`` bool: whether each row's ``key`` index is a sink key of its
        head (``key`` ``[batch, head, query]``, or ``[batch, query]`` for every head; an index
        past the last key is none)."""
        n_keys = self.sinks.shape[-1]
        if key.ndim == 2:
            key = key[:, None, :].expand(-1, self.sinks.shape[1], -1)
        padded = torch.nn.functional.pad(self.sinks, (0, 1))  # index n_keys: no sink
        return torch.gather(padded, -1, key.clamp(max=n_keys))

    def sinks_at(self, keys: torch.Tensor) -> torch.Tensor:
        """``[batch, head, query, n]`` bool: whether the key indices ``keys`` (``[batch,
        query, n]``, the same for every head) are sink keys of each head."""
        n_heads, n_keys = self.sinks.shape[1], self.sinks.shape[-1]
        batch, q_len, n = keys.shape
        padded = torch.nn.functional.pad(self.sinks, (0, 1))  # index n_keys: no sink
        index = keys.clamp(max=n_keys).reshape(batch, 1, q_len * n).expand(-1, n_heads, -1)
        return torch.gather(padded, -1, index).view(batch, n_heads, q_len, n)

    def free_rows(self, a: torch.Tensor, real: torch.Tensor,
                  top: tuple[torch.Tensor, torch.Tensor] | None = None,
                  rest: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(rest, max, argmax)`` ``[batch, head, query]`` of each row over its real keys
        that are no sink: the mass left and where its largest weight is (the first of equal
        weights; 0 at key 0 for a row with nothing left).

        ``rest`` and ``top`` (each row's ``(max, argmax)`` over every key), when both are
        known, spare every pass over the whole block: a row whose largest weight is on a
        real key that is no sink has the same largest weight left, so only the other rows
        are searched again.
        """
        keep = real[:, None, :] & ~self.sinks  # [batch, head, key]
        if rest is None or top is None:  # the free weights, whole: one more pass finds all
            free = a * keep[:, :, None, :].to(a)
            return free.sum(-1) if rest is None else rest, *row_max(free)
        weight, key = top
        redo = ~torch.gather(keep, -1, key)  # the row's largest weight is on a sink
        if bool(redo.any()):
            b, h, q = redo.nonzero(as_tuple=True)
            weight, key = weight.clone(), key.clone()
            weight[b, h, q], key[b, h, q] = row_max(a[b, h, q] * keep[b, h].to(a))
        return rest, weight, key


def sink_view(block: RowBlock, a: torch.Tensor, start_ids: torch.Tensor | None,
              rule: SinkRule, seen: SeenPairs | torch.Tensor | None = None) -> SinkView:
    """Find the sink keys of a block (``a`` ``[batch, head, query, key]`` float) and the
    weights on them (:class:`SinkView`); ``seen``: the pairs its rows see, when known."""
    seen = pairs_seen(block, a) if seen is None else seen
    fixed, sinks = sink_keys(block, a, seen, start_ids, rule)
    index, used = _sink_columns(sinks)
    n_batch, n_heads, q_len, _ = a.shape
    on_sinks = torch.gather(a, -1, index[:, :, None, :].expand(n_batch, n_heads, q_len, -1))
    on_sinks = on_sinks * used[:, :, None, :]
    return SinkView(fixed, sinks, index, used, on_sinks, seen)
