"""The sink mass, and every statistic judged on the mass left after the sink keys
(:mod:`attnprobe.heads.sinks` finds the keys).

With ``s_i`` the row's mass on its sink keys and ``r_i`` the mass on the other (real) keys,
``p_i = a_i / r_i`` on those keys is the row's sink-free distribution. Sink-free means weight
every row by ``r_i``: a row that is nearly all sink counts nearly nothing, a row with no mass
left counts nothing, and a head with no mass left anywhere has no sink-free score.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from attnprobe.core.divergence import entropy
from attnprobe.core.reducers import NAMED_OFFSETS, Sums
from attnprobe.heads.sinks import SinkView
from attnprobe.heads.stats.base import SCORES, STATS, Column, Means, Score, Stat
from attnprobe.heads.stats.offsets import argmax_shares
from attnprobe.heads.tile import Tile

RANK = 30  # place in the tally's statistic order (attnprobe.core.plugins)


def _argmax_bins(offsets: torch.Tensor, weights: torch.Tensor, n_heads: int,
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


class Sinks(Stat):
    """The rule that finds the sink keys, and the far-offset limit, are the tile spec's."""

    group: ClassVar[str] = "sinks"
    columns: ClassVar[tuple[Column, ...]] = (
        Column("sink", "mass on the head's sink keys (and on a learned sink)"),
        Column("sink_rate", "share of rows whose sink mass is above ε (Gu et al.)"),
        Column("column_sink", "mass on column sinks that are neither first nor a start token"),
        Column("rest", "mass on the keys that are no sink"),
        Column("max_weight_nosink", "r_i · max p_i", "rest"),
        Column("chance_weight_nosink", "r_i / keys the row may see that are no sink", "rest"),
        Column("entropy_norm_nosink", "r_i · H(p_i) / ln(keys that are no sink) (rows with "
                                      "two such keys or more)", "own"),
        *(Column(f"{name}_nosink", f"r_i · p_i at offset {d:+d} (a key that is no sink)",
                 "rest") for d, name in NAMED_OFFSETS.items()),
        Column("argmax_nosink@<d>", "r_i · 1[argmax p_i is at offset d]"),
    )

    def __call__(self, tile: Tile) -> dict[str, Sums]:
        view = tile.sinks
        if view is None:
            return {}
        a, block = tile.a, tile.block
        n_heads = a.shape[1]
        only_column = view.used & ~torch.gather(view.fixed[:, None, :].expand_as(view.sinks),
                                                -1, view.index)
        sink = view.on_sinks.sum(-1)
        rest, free_weight, free_key = tile.free_rows
        if block.learned_sink:  # the mass a learned sink took is sink mass too
            sink = sink + (1 - tile.row_mass).clamp(min=0)
        column = (view.on_sinks * only_column[:, :, None, :]).sum(-1)
        # r_i H(p_i) = -Σ_(j no sink) a_ij ln a_ij + r_i ln r_i: the row's entropy less its
        # sink keys' terms
        weighted_entropy = tile.entropy - entropy(view.on_sinks) + torch.special.xlogy(rest,
                                                                                       rest)
        m = (tile.seen.per_row()[:, None, :] - _sinks_seen(tile, view)).to(a)
        rows = tile.rows[:, None, :]
        valid = rows & (rest > 0)
        several = valid & (m >= 2)
        log_m = torch.where(several, m, 2.0).log()

        plain = tile.row_sums([sink, (sink > tile.spec.sinks.epsilon).to(a), column, rest],
                              rows)
        keys = tile.offset_keys(tuple(NAMED_OFFSETS))  # [batch, query, 3]
        near = tile.at_offsets(tuple(NAMED_OFFSETS)) * ~view.sinks_at(keys)
        weighted = tile.row_sums([free_weight, rest / m.clamp(min=1), *near.unbind(-1), rest],
                                 valid)
        mass = weighted[-1]  # Σ r_i over the rows with mass left
        several_sums = tile.row_sums([weighted_entropy / log_m, rest], several)
        out: dict[str, Sums] = {name: plain[i] for i, name in
                                enumerate(("sink", "sink_rate", "column_sink", "rest"))}
        out["max_weight_nosink"] = (weighted[0], mass)
        out["chance_weight_nosink"] = (weighted[1], mass)
        out["entropy_norm_nosink"] = (several_sums[0], several_sums[1])
        for i, name in enumerate(NAMED_OFFSETS.values()):
            out[f"{name}_nosink"] = (weighted[2 + i], mass)
        out.update(_argmax_bins(tile.offset_of(free_key), torch.where(valid, rest, 0.0),
                                n_heads, tile.spec.max_offset))
        return out


def _sinks_seen(tile: Tile, view: SinkView) -> torch.Tensor:
    """``[batch, head, query]``: how many of its head's sink keys each row may see."""
    used = view.used  # [batch, head, m]
    if tile.rule.kind == "all":  # every real key: the same for each valid row
        return (used.sum(-1)[:, :, None] * tile.rows[:, None, :]).to(torch.long)
    if tile.rule.kind in ("causal", "window"):  # by position: keys at or before the row
        key_pos = torch.gather(tile.block.key_pos.to(tile.device), 1,
                               view.index.flatten(1)).view(view.index.shape)
        ahead = key_pos[:, :, None, :] - tile.block.query_pos.to(tile.device)[:, None, :, None]
        seen = ahead <= 0
        if tile.rule.kind == "window":
            seen = seen & (ahead > -tile.rule.window)
        return (seen & used[:, :, None, :] & tile.rows[:, None, :, None]).sum(-1)
    seen = tile.seen.pairs  # [batch, query, key]
    n_heads = used.shape[1]
    sinks_seen = torch.gather(seen[:, None].expand(-1, n_heads, -1, -1), -1,
                              view.index[:, :, None, :].expand(-1, -1, seen.shape[1], -1))
    return (sinks_seen & used[:, :, None, :]).sum(-1)


NOSINK_SCORES = ("prev", "self", "next", "max_weight", "chance_weight", "entropy_norm")


def _sink_free(means: Means) -> dict[str, np.ndarray] | None:
    if not means.has("sink"):
        return None
    nan = np.full(len(means.wide), np.nan)
    out = {name: means.get(name) for name in ("sink", "sink_rate", "column_sink")}
    for column in NOSINK_SCORES:
        found = means.get(f"{column}_nosink")
        out[f"{column}_nosink"] = found if found is not None else nan
    rest, found = means.get("rest"), argmax_shares(means, "argmax_nosink")
    if found is None or rest is None:
        out["pos_score_nosink"] = out["pos_offset_nosink"] = nan
        return out
    top, offset = found
    has_rest = rest > 0
    # argmax_nosink@d and rest are both means over every row: their ratio is Σ r·1[d] / Σ r
    out["pos_score_nosink"] = np.divide(top, rest, out=nan.copy(), where=has_rest)
    out["pos_offset_nosink"] = offset if has_rest.all() else \
        np.where(has_rest, offset.astype(float), np.nan)
    return out


SCORES.register("sink")(Score(
    "sink, sink_rate, column_sink, *_nosink",
    "mass on the head's sink keys: the first token, the start tokens (BOS/CLS) and its column "
    "sinks — keys taking > 0.3 of the mass in most rows that see them, e.g. `[SEP]` or `.` "
    "(and a learned sink's mass); share of rows whose sink mass is > 0.3 (Gu et al.); mass on "
    "column sinks alone; and every `*_nosink` score: the score judged on the mass left after "
    "the sink keys, renormalised per row, each row weighted by that mass (`prev_nosink`, "
    "`self_nosink`, `next_nosink`, `max_weight_nosink`, `chance_weight_nosink`, "
    "`entropy_norm_nosink`, `pos_score_nosink`, `pos_offset_nosink`; NaN for a head with no "
    "mass left). The label rules read these", _sink_free, 400,
    ("sink", "sink_rate", "column_sink", *(f"{c}_nosink" for c in NOSINK_SCORES),
     "pos_score_nosink", "pos_offset_nosink")))
STATS.register("sinks")(Sinks())
