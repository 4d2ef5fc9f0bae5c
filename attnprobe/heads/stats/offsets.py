"""Where heads look in relative terms: mass at each offset ``key - query`` (Clark et al.),
attention distance (Vig & Belinkov), and the offset of each row's argmax (Voita et al.'s
positional heads). Offsets beyond ±``max_offset`` share one ``far`` bin."""

from __future__ import annotations

from functools import lru_cache
from typing import ClassVar

import numpy as np
import torch

from attnprobe.core.reducers import NAMED_OFFSETS, Sums, offset_name
from attnprobe.heads.stats.base import SCORES, STATS, Column, Means, Score, Stat
from attnprobe.heads.tile import Tile

RANK = 20  # place in the tally's statistic order (attnprobe.core.plugins)


def offset_range(tile: Tile) -> tuple[int, int] | None:
    """Lowest and highest offset ``key - query`` between a valid row and a real key of the
    tile (None without such a pair), from the positions alone."""
    block, big = tile.block, 1 << 40
    real, rows = block.real_keys(), block.query_valid
    has = real.any(-1) & rows.any(-1)
    if not bool(has.any()):
        return None
    key_lo = torch.where(real, block.key_pos, big).amin(-1)
    key_hi = torch.where(real, block.key_pos, -big).amax(-1)
    query_lo = torch.where(rows, block.query_pos, big).amin(-1)
    query_hi = torch.where(rows, block.query_pos, -big).amax(-1)
    return int((key_lo - query_hi)[has].min()), int((key_hi - query_lo)[has].max())


def _by_diagonals(tile: Tile) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Mass per head and offset when real tokens sit at their own index: the valid rows are
    summed over the batch first (one pass), offsets are then diagonals of that ``[head, n,
    n]`` sum, read through a skewed view. Returns the lowest offset, ``[head, offsets]`` and
    ``[head]`` distance sums (float64). The skew copies ``[head, n, 3n]`` float64: only for
    whole inputs (a long input's first block of rows, aligned too, takes the gathers)."""
    a = tile.a  # padding keys hold no weight in a valid row
    n = a.shape[-1]
    summed = torch.einsum("bhij,bi->hij", a, tile.rows.to(a)).to(torch.float64)
    index = torch.arange(n, device=a.device)
    distance = (summed * (index[None, :] - index[:, None]).abs()).sum((1, 2))
    width = 3 * n - 2
    padded = torch.nn.functional.pad(summed, (n - 1, n - 1)).contiguous()
    # [head, i, m] = summed[head, i, i + m - (n - 1)]
    skewed = padded.as_strided((summed.shape[0], n, 2 * n - 1), (n * width, width + 1, 1))
    return -(n - 1), skewed.sum(1), distance


def _by_gathers(tile: Tile, near: range) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same for any positions (left padding, a block of rows of a long input, a KV
    cache, cross-attention): the weight at every offset of ``near`` read in one gather
    (``[batch, head, query, offsets]``) and what the rows give every other offset (their real
    mass less those); distances from the key positions in a causal block (one product over
    the keys, shared with the token classes), else in one product with ``|offset|``. Returns
    ``[head, offsets]`` masses, the ``[head]`` mass beyond ``near`` and ``[head]`` distance
    sums (float64)."""
    rows = tile.rows[:, None, :, None]
    columns = tile.at_offsets(near)  # [batch, head, query, offsets]
    beyond = tile.row_mass - columns.sum(-1)
    by_offset = torch.where(rows, columns, 0.0).sum(dim=(0, 2), dtype=torch.float64)
    if tile.causal_distance:  # Σ_j a_ij (p_i - p_j) = (p_i - p_0) Σ_j a_ij + Σ_j a_ij (p_0 - p_j)
        start = tile.block.query_pos.to(tile.device)[:, :1]
        ahead = (tile.block.query_pos.to(tile.device) - start).to(tile.a)[:, None, :]
        per_row = ahead * tile.row_mass + tile.class_masses["before"]
    else:
        weights = tile.a * tile.real[:, None, None, :]
        per_row = torch.einsum("bhqk,bqk->bhq", weights, tile.rel.abs().to(tile.a))
    return by_offset, tile.row_sum(beyond), tile.row_sum(per_row)


def offset_label(offset: int, limit: int | None) -> str:
    """An offset's bin: ``+d`` / ``-d``, or ``far`` beyond ±limit."""
    return "far" if limit is not None and abs(offset) > limit else f"{offset:+d}"


class Offsets(Stat):
    """Offsets beyond ±``tile.spec.max_offset`` are pooled into ``offset@far`` /
    ``argmax@far`` (None: a bin per offset, O(length) statistics per block on long
    inputs)."""

    group: ClassVar[str] = "offsets"
    columns: ClassVar[tuple[Column, ...]] = (
        Column("distance", "attention distance Σ_j a_ij |i - j| in tokens"),
        Column("offset@<d>", "mass on the key at relative offset d (``far``: beyond the "
                             "limit)"),
        Column("argmax@<d>", "share of rows whose largest weight is at offset d"),
    )

    def __call__(self, tile: Tile) -> dict[str, Sums]:
        span = offset_range(tile)
        if span is None:
            return {}
        limit = tile.spec.max_offset
        # one bin per offset seen; with a limit, offsets beyond it share the end bins (far)
        bounds = span if limit is None else (max(span[0], -limit - 1), min(span[1], limit + 1))
        names, of_bin = _bins(*bounds, limit)
        n_labels = len(names) // 2
        if tile.whole:
            lo, mass, distance = _by_diagonals(tile)  # mass [head, diagonal], lo..
            diagonal = torch.arange(lo, lo + mass.shape[1]).clamp(*bounds) - bounds[0]
            masses = mass.new_zeros(mass.shape[0], n_labels).index_add_(
                1, of_bin[diagonal], mass)
        else:
            near = range(span[0], span[1] + 1) if limit is None else \
                range(max(span[0], -limit), min(span[1], limit) + 1)
            by_offset, beyond, distance = _by_gathers(tile, near)  # [head, offsets]
            masses = by_offset.new_zeros(by_offset.shape[0], n_labels)
            masses[:, of_bin[near.start - bounds[0]:near.stop - bounds[0]]] = by_offset
            if bounds != span:
                masses[:, of_bin[0] if span[0] < bounds[0] else of_bin[-1]] = beyond
        top = tile.top_offset.clamp(*bounds) - bounds[0]
        n_heads = top.shape[1]
        heads = torch.arange(n_heads, device=tile.device)[None, :, None]
        valid = tile.rows[:, None, :].expand_as(top)
        shares = torch.bincount((of_bin.to(tile.device)[top] + n_labels * heads)[valid],
                                minlength=n_heads * n_labels)
        shares = shares.view(n_heads, n_labels).to(torch.float64)
        out: dict[str, Sums] = {"distance": distance}
        pairs = torch.stack([masses, shares.to(masses.device)], -1).flatten(1)  # offset@, argmax@
        out.update(zip(names, pairs.unbind(1), strict=True))
        return out


@lru_cache(maxsize=1024)
def _bins(lo: int, hi: int, limit: int | None) -> tuple[tuple[str, ...], torch.Tensor]:
    """The statistics of the offset bins ``lo..hi`` (``offset@<label>``, ``argmax@<label>``
    of each label in offset order; ``far`` once) and each bin's label index."""
    labels = [offset_label(d, limit) for d in range(lo, hi + 1)]
    unique = list(dict.fromkeys(labels))
    names = tuple(f"{what}@{label}" for label in unique for what in ("offset", "argmax"))
    return names, torch.tensor([unique.index(label) for label in labels])


def argmax_shares(means: Means, prefix: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(share at the most common argmax offset, that offset) per head from the
    ``<prefix>@<offset>`` means, or None without them (the far bin is no offset)."""
    columns = [c for c in means.prefixed(prefix) if c != prefix + "@far"]
    if not columns:
        return None
    shares = means.wide[columns].fillna(0.0)
    return shares.max(axis=1).to_numpy(), \
        shares.idxmax(axis=1).map(lambda c: int(c.split("@")[1])).to_numpy()


def _offset_columns(means: Means) -> dict[str, np.ndarray]:
    nan = np.full(len(means.wide), np.nan)
    out = {}
    for offset in range(-means.window, means.window + 1):
        found = means.get(f"offset@{offset:+d}")
        out[offset_name(offset)] = found if found is not None else nan
    return out


def _positional(means: Means) -> dict[str, np.ndarray] | None:
    found = argmax_shares(means, "argmax")
    return None if found is None else {"pos_score": found[0], "pos_offset": found[1]}


SCORES.register("offsets")(Score(
    "prev, self, next, offset±k", "mass on the key at offset -1, 0, +1 (Clark et al.), and at "
    f"±k for 2 <= k <= window (named {', '.join(NAMED_OFFSETS.values())}, offset-k, offset+k)",
    _offset_columns, 200, tuple(offset_name(d) for d in range(-3, 4))))
SCORES.register("distance")(Score(
    "distance", "mean attention distance Σ_j a_ij |i - j| in tokens (Vig & Belinkov)",
    lambda means: means.column("distance"), 210))
SCORES.register("pos_score")(Score(
    "pos_score, pos_offset", "share of rows whose argmax is at the most common offset, and "
    "that offset (Voita)", _positional, 220, ("pos_score", "pos_offset")))
STATS.register("offsets")(Offsets())
