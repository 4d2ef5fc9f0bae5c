"""Reducer sums of many blocks of one site, added as one stacked tensor per block.

A long input reaches the reducers as hundreds of blocks of rows per layer, each giving
hundreds of statistics (one per offset bin); adding them to a
:class:`~attnprobe.core.reducers.Tally` one statistic at a time would cost more than the
statistics. :class:`PackedSums` stacks each block's sums and adds them in one operation; the
tally unpacks them once, after the site's last block.
"""

from __future__ import annotations

import torch

__all__ = ["PackedSums", "Sums"]

Sums = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
"""What a reducer returns per statistic: ``[head]`` sums over the block's valid rows (the
mean is over all rows), or ``(sums, counts)`` when the statistic is defined on only some rows
(e.g. rows whose token occurs earlier)."""


class PackedSums:
    """The sums of the blocks of one site so far, stacked: ``[statistic, head]`` values and
    ``[statistic with its own count, head]`` counts, indexed by name in the order first
    seen (hundreds of statistics on a long input: one addition per block instead of one per
    statistic and block)."""

    def __init__(self, head_shape: torch.Size, device: torch.device) -> None:
        self.index: dict[str, int] = {}
        self.count_index: dict[str, int] = {}
        self.values = torch.zeros(0, *head_shape, dtype=torch.float64, device=device)
        self.counts = self.values

    @classmethod
    def of(cls, sums: dict[str, Sums]) -> PackedSums | None:
        if not sums:
            return None
        first = next(iter(sums.values()))
        first = first[0] if isinstance(first, tuple) else first
        packed = cls(first.shape, first.device)
        return packed if packed.add(sums) else None

    def add(self, sums: dict[str, Sums]) -> bool:
        """Add the sums of one more block; False when they do not stack with the others."""
        values = [v[0] if isinstance(v, tuple) else v for v in sums.values()]
        paired = {name: v[1] for name, v in sums.items() if isinstance(v, tuple)}
        if any((name in paired) != (name in self.count_index) for name in sums
               if name in self.index):
            return False
        try:
            stacked = torch.stack(values).to(torch.float64)
            counts = torch.stack(list(paired.values())).to(torch.float64) if paired else None
        except RuntimeError:  # sums of different shapes: added one by one
            return False
        if stacked.shape[1:] != self.values.shape[1:]:
            return False
        for name in sums:
            self.index.setdefault(name, len(self.index))
        for name in paired:
            self.count_index.setdefault(name, len(self.count_index))
        self.values = _grown(self.values, len(self.index))
        self.counts = _grown(self.counts, len(self.count_index))
        device = self.values.device
        self.values.index_add_(0, torch.tensor([self.index[n] for n in sums], device=device),
                               stacked)
        if counts is not None:
            self.counts.index_add_(0, torch.tensor([self.count_index[n] for n in paired],
                                                   device=device), counts)
        return True

    def finite(self) -> bool:
        return bool(torch.isfinite(self.values).all())

    def unpacked(self) -> dict[str, Sums]:
        return {name: (self.values[i], self.counts[self.count_index[name]])
                if name in self.count_index else self.values[i]
                for name, i in self.index.items()}


def _grown(stacked: torch.Tensor, rows: int) -> torch.Tensor:
    """``stacked`` with zero rows appended up to ``rows``."""
    if rows <= len(stacked):
        return stacked
    return torch.cat([stacked, stacked.new_zeros(rows - len(stacked), *stacked.shape[1:])])
