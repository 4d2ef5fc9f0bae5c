"""Sink keys, and every head statistic judged on the mass left after them.

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

**Statistics** (sums over the block's valid rows; :mod:`attnprobe.heads.scores` turns them into
columns). With ``s_i`` the row's mass on its sink keys and ``r_i`` the mass on the other (real)
keys, ``p_i = a_i / r_i`` on those keys is the row's sink-free distribution. Sink-free means
weight every row by ``r_i``: a row that is nearly all sink counts nearly nothing, a row with no
mass left counts nothing, and a head with no mass left anywhere has no sink-free score.

=======================  ===================================================================
statistic                sum over rows (sink-free ones: ``(sum, Σ r_i)``)
=======================  ===================================================================
sink                     ``s_i`` (plus the mass a learned sink took, ``1 - Σ_j a_ij``)
sink_rate                ``1[s_i > epsilon]``
column_sink              mass on column sinks that are neither first nor a start token
rest                     ``r_i``
prev/self/next_nosink    ``r_i · p_i[i + d]`` (mass at offset ``d`` on a key that is no sink)
max_weight_nosink        ``r_i · max p_i``
chance_weight_nosink     ``r_i / m_i``, ``m_i`` = keys the row may see that are no sink (≥ 1)
entropy_norm_nosink      ``r_i · H(p_i) / ln m_i`` (rows with ``m_i ≥ 2``)
argmax_nosink@d          ``r_i · 1[argmax p_i is at offset d]`` (plain sums, divided by
                         ``rest`` in the score table)
=======================  ===================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnprobe.core.divergence import entropy
from attnprobe.core.reducers import RowBlock, Sums
from attnprobe.errors import InputError

__all__ = ["NAMED_OFFSETS", "SinkRule", "SinkView", "aligned", "pairs_seen", "sink_keys",
           "sink_sums", "sink_view"]

NAMED_OFFSETS = {-1: "prev", 0: "self", 1: "next"}


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
    """``[batch, query, key]`` bool: the (valid) row may attend to the (real) key.

    Read from the block's ``visible`` counts when they match a bidirectional (every real key)
    or causal (keys up to the row's own position) mask; otherwise, the keys some head of the
    block gave weight to.
    """
    device = a.device
    rows = block.query_valid.to(device)
    real = block.real_keys().to(device)[:, None, :] & rows[:, :, None]
    if block.visible is None:
        return real
    visible = block.visible.to(device)
    if bool(((visible == block.key_len.to(device)[:, None]) | ~rows).all()):
        return real
    query_pos, key_pos = block.query_pos.to(device), block.key_pos.to(device)
    if bool(((visible == query_pos + 1) | ~rows).all()):
        return real & (key_pos[:, None, :] <= query_pos[:, :, None])
    return real & (a > 0).any(1)


def sink_keys(block: RowBlock, a: torch.Tensor, seen: torch.Tensor,
              start_ids: torch.Tensor | None, rule: SinkRule
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fixed [batch, key], sinks [batch, head, key])`` bool: the first token and start
    tokens, and every sink key of each head (those plus its column sinks).

    ``a`` ``[batch, head, query, key]``; ``seen`` from :func:`pairs_seen`; ``start_ids``: ids
    of the start tokens (None or empty: only the first token is fixed).
    """
    device = a.device
    real = block.real_keys().to(device)
    fixed = (block.key_pos.to(device) == 0) & real
    if start_ids is not None and start_ids.numel() and block.key_ids is not None:
        fixed = fixed | (torch.isin(block.key_ids.to(device), start_ids.to(device)) & real)
    seers = seen.sum(1)  # [batch, key]
    # More than share·seers rows above epsilon needs a column sum above epsilon·share·seers,
    # so one cheap pass finds the few candidates (the sum over every row, padding rows
    # included, can only overestimate) and only their columns are counted exactly.
    column_sum = torch.nansum(a, 2)  # [batch, head, key]
    candidate = (column_sum > rule.epsilon * rule.share * seers[:, None, :]) \
        & ((seers >= rule.min_rows) & real & ~fixed)[:, None, :]
    b, h, k = candidate.nonzero(as_tuple=True)
    column = torch.zeros_like(candidate)
    if len(b):
        hits = ((a[b, h, :, k] > rule.epsilon) & seen[b, :, k]).sum(-1)  # [candidates]
        ok = hits > rule.share * seers[b, k]
        column[b[ok], h[ok], k[ok]] = True
    return fixed, column | (fixed[:, None, :] & real[:, None, :])


def _sink_columns(sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index, used)`` ``[batch, head, m]``: the key index of each head's sink keys, padded
    to the most any head has (``used`` False on the padding)."""
    order = torch.sort(sinks.to(torch.uint8), dim=-1, descending=True, stable=True)
    width = max(int(sinks.sum(-1).max()), 1)
    return order.indices[..., :width], order.values[..., :width].bool()


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
        free: ``[batch, head, query, key]`` the weights with the sink keys zeroed.
        rest: ``[batch, head, query]`` mass on the keys that are no sink.
        top_weight / top_key: ``[batch, head, query]`` the largest of ``free`` and its key.
        seen: ``[batch, query, key]`` the pairs the block's rows may attend to
            (:func:`pairs_seen`).
    """

    fixed: torch.Tensor
    sinks: torch.Tensor
    index: torch.Tensor
    used: torch.Tensor
    on_sinks: torch.Tensor
    free: torch.Tensor
    rest: torch.Tensor
    top_weight: torch.Tensor
    top_key: torch.Tensor
    seen: torch.Tensor

    def raw_top(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(max, argmax)`` of every key of each row, as ``a.max(-1)`` gives them (the first
        key of equal weights), read off the sink-free maximum and the sink keys' weights
        instead of one more pass over the weights."""
        sink_weight, which = self.on_sinks.max(-1)
        sink_key = _per_query(self.index, which)
        wins = (sink_weight > self.top_weight) | (
            (sink_weight == self.top_weight) & (sink_key < self.top_key))
        return (torch.where(wins, sink_weight, self.top_weight),
                torch.where(wins, sink_key, self.top_key))


def _per_query(index: torch.Tensor, which: torch.Tensor) -> torch.Tensor:
    """``index[b, h, which[b, h, q]]`` ``[batch, head, query]``."""
    return torch.gather(index, -1, which.reshape(which.shape[0], which.shape[1], -1)
                        ).view_as(which)


def sink_view(block: RowBlock, a: torch.Tensor, start_ids: torch.Tensor | None,
              rule: SinkRule) -> SinkView:
    """Find the sink keys of a block (``a`` ``[batch, head, query, key]`` float) and split its
    weights at them (:class:`SinkView`)."""
    seen = pairs_seen(block, a)
    fixed, sinks = sink_keys(block, a, seen, start_ids, rule)
    index, used = _sink_columns(sinks)
    n_batch, n_heads, q_len, _ = a.shape
    on_sinks = torch.gather(a, -1, index[:, :, None, :].expand(n_batch, n_heads, q_len, -1))
    on_sinks = on_sinks * used[:, :, None, :]
    free_keys = block.real_keys().to(a.device)[:, None, :] & ~sinks  # [batch, head, key]
    free = a * free_keys[:, :, None, :].to(a)
    top_weight, top_key = free.max(-1)
    return SinkView(fixed, sinks, index, used, on_sinks, free, free.sum(-1), top_weight,
                    top_key, seen)


def _at_offsets(view: SinkView, rel: torch.Tensor, real: torch.Tensor, is_aligned: bool
                ) -> torch.Tensor:
    """``[batch, head, query, 3]``: the sink-free weight on the real key at offset -1, 0, +1
    of each row (0 where there is none): diagonals when the block is aligned, else read by
    index."""
    w = view.free
    batch, n_heads, q_len, _ = w.shape
    out = []
    for d in NAMED_OFFSETS:
        if is_aligned:  # padding keys hold no weight, so the diagonal needs no mask
            diagonal = w.diagonal(d, 2, 3)  # rows max(0, -d) ..
            out.append(F.pad(diagonal, (max(0, -d), q_len - diagonal.shape[-1] - max(0, -d))))
            continue
        hit = (rel == d) & real[:, None, :]  # [batch, query, key]
        where = hit.to(torch.uint8).argmax(-1)  # [batch, query]
        index = where[:, None, :, None].expand(batch, n_heads, q_len, 1)
        out.append(torch.gather(w, -1, index)[..., 0] * hit.any(-1)[:, None, :])
    return torch.stack(out, -1)


def _offset_bins(offsets: torch.Tensor, weights: torch.Tensor, n_heads: int,
                 max_offset: int | None) -> dict[str, torch.Tensor]:
    """``argmax_nosink@<offset>`` sums ``[head]`` of ``weights`` ``[batch, head, query]``
    (zero on rows that do not count) by the argmax offset ``[batch, head, query]``."""
    used = weights > 0
    if not bool(used.any()):
        return {}
    if max_offset is not None:  # every far offset into one bin (one past the limit)
        offsets = torch.where(offsets.abs() > max_offset, max_offset + 1, offsets)
    lo = int(torch.where(used, offsets, offsets.max()).min())
    hi = int(torch.where(used, offsets, offsets.min()).max())
    n_bins = hi - lo + 1
    heads = torch.arange(n_heads, device=offsets.device)[None, :, None]
    # rows that do not count have weight 0 and add nothing, wherever they land
    index = (offsets.clamp(lo, hi) - lo) + n_bins * heads
    sums = torch.zeros(n_heads * n_bins, dtype=torch.float64, device=offsets.device)
    sums.index_add_(0, index.flatten(), weights.flatten().to(torch.float64))
    sums = sums.view(n_heads, n_bins)
    out: dict[str, torch.Tensor] = {}
    for b in (sums > 0).any(0).nonzero()[:, 0].tolist():
        offset = lo + b
        label = "far" if max_offset is not None and abs(offset) > max_offset else f"{offset:+d}"
        name = f"argmax_nosink@{label}"
        out[name] = out[name] + sums[:, b] if name in out else sums[:, b]
    return out


def sink_sums(block: RowBlock, a: torch.Tensor, rel: torch.Tensor, view: SinkView,
              rule: SinkRule, max_offset: int | None = None,
              row_entropy: torch.Tensor | None = None) -> dict[str, Sums]:
    """Every statistic of the module docstring for one block.

    ``a`` ``[batch, head, query, key]`` float; ``rel`` ``[batch, query, key]`` key position
    minus query position; ``view``: :func:`sink_view` of the block; ``row_entropy``
    ``[batch, head, query]``: ``entropy(a)`` when the caller has it already.
    """
    seen = view.seen
    real = block.real_keys().to(a.device)
    rest = view.rest
    only_column = view.used & ~torch.gather(view.fixed[:, None, :].expand_as(view.sinks), -1,
                                            view.index)
    sink = view.on_sinks.sum(-1)
    if block.learned_sink:  # the mass a learned sink took is sink mass too
        sink = sink + (1 - a.sum(-1)).clamp(min=0)
    column = (view.on_sinks * only_column[:, :, None, :]).sum(-1)
    # r_i H(p_i) = -Σ_(j no sink) a_ij ln a_ij + r_i ln r_i, the first term being the row's
    # entropy less its sink keys' terms
    row_entropy = entropy(a) if row_entropy is None else row_entropy
    weighted_entropy = row_entropy - entropy(view.on_sinks) + torch.special.xlogy(rest, rest)
    free_keys = (real[:, None, :] & ~view.sinks).to(a)
    m = torch.einsum("bqk,bhk->bhq", seen.to(a), free_keys)  # keys seen that are no sink
    valid = block.query_valid.to(a.device)[:, None, :] & (rest > 0)
    several = valid & (m >= 2)
    log_m = torch.where(several, m, 2.0).log()

    # rows' statistics stacked on a last axis, so each mask is applied and summed once
    query_valid = block.query_valid.to(a.device)[:, None, :, None]
    plain = torch.stack([sink, (sink > rule.epsilon).to(a), column, rest], -1)
    plain = torch.where(query_valid, plain.to(torch.float64), 0.0).sum(dim=(0, 2))  # [head, 4]
    is_aligned = aligned(block)
    at_offset = _at_offsets(view, rel, real, is_aligned)  # [batch, head, query, 3]
    weighted = torch.cat([view.top_weight[..., None], (rest / m.clamp(min=1))[..., None],
                          at_offset, rest[..., None]], -1)
    weighted = torch.where(valid[..., None], weighted, 0.0).sum(dim=(0, 2),
                                                                dtype=torch.float64)
    mass = weighted[:, -1]  # Σ r_i over the rows with mass left
    several_sums = torch.stack([weighted_entropy / log_m, rest], -1)
    several_sums = torch.where(several[..., None], several_sums, 0.0).sum(dim=(0, 2),
                                                                          dtype=torch.float64)
    out: dict[str, Sums] = {name: plain[:, i] for i, name in
                            enumerate(("sink", "sink_rate", "column_sink", "rest"))}
    out["max_weight_nosink"] = (weighted[:, 0], mass)
    out["chance_weight_nosink"] = (weighted[:, 1], mass)
    out["entropy_norm_nosink"] = (several_sums[:, 0], several_sums[:, 1])
    for i, name in enumerate(NAMED_OFFSETS.values()):
        out[f"{name}_nosink"] = (weighted[:, 2 + i], mass)
    if is_aligned:
        offsets = view.top_key - torch.arange(a.shape[2], device=a.device)
    else:
        offsets = torch.gather(rel[:, None].expand_as(a), -1, view.top_key[..., None])[..., 0]
    out.update(_offset_bins(offsets, torch.where(valid, rest, 0.0), a.shape[1], max_offset))
    return out
