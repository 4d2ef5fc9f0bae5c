"""Streaming head statistics: reducers that consume attention as it is computed.

A reducer turns a block of attention rows (:class:`~attnprobe.core.row_blocks.RowBlock`) into
per-head *sums*; a :class:`Tally` adds those sums and the number of rows seen. Means are
``sum / count``, so tallies from different batches, processes or machines merge exactly with
``+``. No ``[query, key]`` matrix has to be kept: the capture seam can feed blocks of query
rows and drop them.

Every reducer is a frozen dataclass with a ``name`` and ``__call__(block) -> {statistic: sums}``
where ``sums`` is a float64 tensor ``[head]``; :func:`reduce_block` runs a list of them (the
one loop every reader of row blocks uses). The per-head numbers have one home, the census
statistics (:mod:`attnprobe.heads.stats`): the simple reducers of the per-head summary
(``Entropy``, ``MaxWeight``, ``OffsetMass``) are views of them, registered here by
:mod:`attnprobe.heads.stat_views` (this floor cannot import them). :class:`KeyMass` — the mass
at a key position, without token ids — has no census counterpart and is defined here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pandas as pd
import torch

from attnprobe.core.display import counted, describe, indices
from attnprobe.core.packed_sums import PackedSums, Sums
from attnprobe.core.registry import Registry
from attnprobe.core.row_blocks import RowBlock
from attnprobe.core.scope import head_id

# Tidy columns of Tally.to_frame().
STAT_COLUMNS = ("stack", "kind", "layer", "head", "head_id", "statistic", "value", "sum", "count")


class Reducer(Protocol):
    name: str

    def __call__(self, block: RowBlock) -> dict[str, Sums]: ...


REDUCERS: Registry[type] = Registry("reducer")

DEFAULT_REDUCERS = ("entropy", "max_weight", "offset_mass", "key_mass")
"""The per-head summary, by :data:`REDUCERS` name, in column order (the first three are
registered by :mod:`attnprobe.heads.stat_views`, which ``import attnprobe`` loads)."""


def reduce_block(reducers: Iterable[Reducer], block: RowBlock) -> dict[str, Sums]:
    """Every reducer's sums of ``block``, merged in order (a later statistic of the same name
    wins): the one reducer loop of the capture, the census and stored maps."""
    sums: dict[str, Sums] = {}
    for reducer in reducers:
        sums.update(reducer(block))
    return sums


NAMED_OFFSETS = {-1: "prev", 0: "self", 1: "next"}  # the one definition of these names


def offset_name(offset: int) -> str:
    """``prev``, ``self``, ``next``, or ``offset+k`` / ``offset-k``."""
    return NAMED_OFFSETS.get(offset, f"offset{offset:+d}")


@REDUCERS.register("key_mass")
@dataclass(frozen=True)
class KeyMass:
    """Mass on given key positions among the real tokens; negative counts from the end.

    ``KeyMass((0, -1))`` gives ``key[0]`` (e.g. ``[CLS]`` or a BOS sink) and ``key[-1]``
    (e.g. ``[SEP]``).
    """

    positions: tuple[int, ...] = (0,)
    name: str = "key_mass"

    def __call__(self, block: RowBlock) -> dict[str, torch.Tensor]:
        out = {}
        for position in self.positions:
            target = position if position >= 0 else block.key_len + position  # [batch] or int
            target = torch.as_tensor(target).reshape(-1, 1)
            hit = (block.key_pos == target).to(block.pattern.dtype)  # [batch, key]
            mass = (block.pattern * hit[:, None, None, :]).sum(-1)
            out[f"key[{position}]"] = block.masked_row_sum(mass)
        return out


def default_reducers() -> list[Reducer]:
    """The per-head summary: entropy, max weight, previous/self/next mass, first-key mass
    (:data:`DEFAULT_REDUCERS`, each with its default settings).

    Example:
        >>> [type(r).__name__ for r in default_reducers()]
        ['Entropy', 'MaxWeight', 'OffsetMass', 'KeyMass']
        >>> tally = ap.head_stats(model, tok, texts, scope="layer:0", reducers=default_reducers())
        >>> list(tally.summary().columns[5:])           # one column per statistic
        ['entropy', 'max_weight', 'prev', 'self', 'next', 'key[0]']
    """
    return [REDUCERS.get(name)() for name in DEFAULT_REDUCERS]


SiteKey = tuple[str, str, int]  # (stack, kind, layer)


def _accumulate(into: dict, key: object, value: torch.Tensor) -> None:
    into[key] = into[key] + value if key in into else value


@dataclass
class Tally:
    """Mergeable sums and row counts per (statistic, stack, kind, layer, head).

    ``a + b`` is exact: it adds sums and counts, so a corpus can be split anywhere.
    ``counts`` are rows per site; a statistic defined on only some rows keeps its own
    ``stat_counts`` (per head).
    """

    sums: dict[tuple[str, SiteKey], torch.Tensor] = field(default_factory=dict)
    counts: dict[SiteKey, float] = field(default_factory=dict)
    heads: dict[SiteKey, tuple[int, ...]] = field(default_factory=dict)
    stat_counts: dict[tuple[str, SiteKey], torch.Tensor] = field(default_factory=dict)
    # per site, the sums of its blocks so far while more blocks of it follow (add_sums)
    _pending: dict[SiteKey, PackedSums] = field(default_factory=dict, repr=False, compare=False)

    def add(self, site: SiteKey, heads: tuple[int, ...], block: RowBlock,
            reducers: Iterable[Reducer], *, more: bool = False) -> bool:
        """Feed one block of rows of one layer (``pattern`` restricted to ``heads``) to
        ``reducers``; ``more`` and the result as :meth:`add_sums`."""
        return self.add_sums(site, heads, float(block.query_valid.sum()),
                             reduce_block(reducers, block), more=more)

    def add_sums(self, site: SiteKey, heads: tuple[int, ...], rows: float,
                 sums: dict[str, Sums], *, more: bool = False) -> bool:
        """Add reducer outputs already computed for ``rows`` query rows of ``site``;
        ``more``: further blocks of the site follow (their sums are packed and added with
        the last one). Returns whether every sum added so far for the site's blocks is
        finite."""
        known = self.heads.setdefault(site, heads)
        if known != heads:
            raise ValueError(f"heads {heads} differ from {known} already tallied for {site}")
        self.counts[site] = self.counts.get(site, 0.0) + rows
        packed = self._pending.get(site)
        if packed is not None and packed.add(sums):
            sums = {}
        else:
            self._flush(site)
            packed = PackedSums.of(sums)
            if packed is not None:
                self._pending[site], sums = packed, {}
        finite = True
        if not more:
            finite = self._flush(site)
        if sums:  # sums that do not stack, added one by one
            finite = finite and all(bool(torch.isfinite(v).all()) for value in sums.values()
                                    for v in (value if isinstance(value, tuple) else (value,)))
            self._add_now(site, sums)
        return finite

    def _add_now(self, site: SiteKey, sums: dict[str, Sums]) -> None:
        for stat, value in sums.items():
            key = (stat, site)
            if isinstance(value, tuple):
                value, count = value
                _accumulate(self.stat_counts, key, count.to(torch.float64))
            _accumulate(self.sums, key, value)

    def _flush(self, site: SiteKey | None = None) -> bool:
        """Hand the packed sums of ``site`` (None: every site) over; whether they are
        finite."""
        finite = True
        for key in [site] if site is not None else list(self._pending):
            packed = self._pending.pop(key, None)
            if packed is not None:
                finite = finite and packed.finite()
                self._add_now(key, packed.unpacked())
        return finite

    def __repr__(self) -> str:
        self._flush()
        stats = list(dict.fromkeys(stat for stat, _ in self.sums))
        named = ", ".join(stats[:3]) + (", …" if len(stats) > 3 else "")
        groups = {site[:2] for site in self.heads}
        rows = sorted(set(self.counts.values()))
        return describe(
            "Tally", f"{counted(len(stats), 'statistic')}" + (f" ({named})" if stats else "")
            + f" × {counted(sum(len(h) for h in self.heads.values()), 'head')} in "
            f"{counted(len({site[2] for site in self.heads}), 'layer')}"
            + (f" ({indices(site[2] for site in self.heads)})" if self.heads else ""),
            f"{counted(len(groups), 'attention stack')}" if len(groups) > 1 else None,
            counted(rows[0] if rows else 0, "row") if len(rows) <= 1 else
            f"{counted(rows[0])}-{counted(rows[-1], 'row')} per layer")

    def __radd__(self, other: object) -> Tally:
        if other == 0:  # sum(tallies)
            return self
        return NotImplemented

    def __add__(self, other: Tally) -> Tally:
        if not isinstance(other, Tally):
            return NotImplemented
        self._flush()
        other._flush()
        merged = Tally(dict(self.sums), dict(self.counts), dict(self.heads),
                       dict(self.stat_counts))
        for site, heads in other.heads.items():
            if merged.heads.setdefault(site, heads) != heads:
                raise ValueError(f"cannot merge tallies with different heads for {site}")
        for site, count in other.counts.items():
            merged.counts[site] = merged.counts.get(site, 0.0) + count
        for key, value in other.sums.items():
            _accumulate(merged.sums, key, value)
        for key, value in other.stat_counts.items():
            _accumulate(merged.stat_counts, key, value)
        return merged

    def to_frame(self) -> pd.DataFrame:
        """Tidy table, columns ``STAT_COLUMNS``; ``value = sum / count`` (mean over rows).

        Heads for which a statistic saw no row get no entry (never a NaN mean).
        """
        self._flush()
        rows = []
        stats = list(dict.fromkeys(stat for stat, _ in self.sums))  # reducer order
        for site in sorted(self.counts):
            stack, kind, layer = site
            n_heads = len(self.heads[site])
            for stat in stats:
                sums = self.sums.get((stat, site))
                if sums is None:
                    continue
                counts = self.stat_counts.get((stat, site))
                counts = [self.counts[site]] * n_heads if counts is None else counts.tolist()
                for head, total, count in zip(self.heads[site], sums.tolist(), counts,
                                              strict=True):
                    if count:
                        rows.append((stack, kind, layer, head, head_id(layer, head), stat,
                                     total / count, total, count))
        return pd.DataFrame(rows, columns=list(STAT_COLUMNS))

    def wide(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """``(means, counts)``: one row per head that saw a row (index ``stack, kind, layer,
        head, head_id``), one column per statistic in order of first appearance, NaN where a
        head saw no row of it — ``to_frame`` pivoted on ``statistic``, built from the sums."""
        self._flush()
        stats = list(dict.fromkeys(stat for stat, _ in self.sums))  # reducer order
        column: dict[str, int] = {}
        blocks = []  # per site: heads kept, column of each statistic, [head, stat] sums, counts
        for site in sorted(self.counts):
            names = [stat for stat in stats if (stat, site) in self.sums]
            if not names:
                continue
            n_heads = len(self.heads[site])
            sums = torch.stack([self.sums[(stat, site)] for stat in names], 1).cpu().numpy()
            counts = np.array([np.full(n_heads, self.counts[site])
                               if (stat, site) not in self.stat_counts
                               else self.stat_counts[(stat, site)].cpu().numpy()
                               for stat in names]).T
            used = counts.any(0)  # statistics some head saw a row of
            for stat in np.array(names)[used]:
                column.setdefault(str(stat), len(column))
            kept = counts.any(1)
            blocks.append((site, kept, [column.get(stat, -1) for stat in names],
                           sums[kept], counts[kept]))
        keys = [(*site, head, head_id(site[2], head)) for site, kept, *_ in blocks
                for head, k in zip(self.heads[site], kept, strict=True) if k]
        means = np.full((len(keys), len(column)), np.nan)
        seen = np.full_like(means, np.nan)
        start = 0
        for _, _, where, sums, counts in blocks:
            rows = slice(start, start + len(sums))
            start += len(sums)
            where = np.array(where)
            on = where >= 0
            counts = np.where(counts != 0, counts, np.nan)[:, on]
            means[rows, where[on]] = sums[:, on] / counts
            seen[rows, where[on]] = counts
        levels = [[key[i] for key in keys] for i in range(5)]
        index = pd.MultiIndex.from_arrays(levels, names=list(STAT_COLUMNS[:5]))
        return (pd.DataFrame(means, index=index, columns=list(column)),
                pd.DataFrame(seen, index=index, columns=list(column)))

    def summary(self) -> pd.DataFrame:
        """One row per head, one column per statistic (wide view of ``to_frame``)."""
        means, _ = self.wide()
        if means.empty:
            return self.to_frame()
        return means.reset_index()
