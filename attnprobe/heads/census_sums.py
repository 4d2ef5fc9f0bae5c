"""What the census sums per batch, mergeable: per-head statistics of every layer, syntax
counts and head distances. The sums of batches (and of processes) add exactly, in batch
order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnprobe.core.display import counted, describe, grid
from attnprobe.core.reducers import Tally
from attnprobe.errors import InputError
from attnprobe.heads.dependencies import SyntaxCounts
from attnprobe.heads.similarity import HeadDistances

__all__ = ["CensusSums", "StackedSums"]


@dataclass
class StackedSums:
    """Reducer sums of several layers of one (stack, kind) at once (those whose rows see the
    same keys), ``[layer * head]`` per statistic. Batches add these; they are split into a
    per-layer :class:`Tally` once, at the end (splitting per batch costs more than the
    statistics themselves)."""

    stack: str
    kind: str
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    rows: float
    sums: dict[str, Any]

    def __add__(self, other: StackedSums) -> StackedSums:
        if (self.stack, self.kind, self.layers, self.heads) != \
                (other.stack, other.kind, other.layers, other.heads):
            raise InputError("cannot add sums of different attention sites")
        sums = dict(self.sums)
        for name, value in other.sums.items():
            if name not in sums:
                sums[name] = value
            elif isinstance(value, tuple):
                sums[name] = (sums[name][0] + value[0], sums[name][1] + value[1])
            else:
                sums[name] = sums[name] + value
        return StackedSums(self.stack, self.kind, self.layers, self.heads,
                           self.rows + other.rows, sums)

    def __repr__(self) -> str:
        return describe("StackedSums", f"{self.stack} {self.kind}",
                        grid(self.layers, self.heads), counted(len(self.sums), "statistic"),
                        counted(self.rows, "row"))

    def to_tally(self) -> Tally:
        tally = Tally()
        n_heads = len(self.heads)
        for li, layer in enumerate(self.layers):
            heads = slice(li * n_heads, (li + 1) * n_heads)
            layer_sums = {name: tuple(v[heads] for v in value) if isinstance(value, tuple)
                          else value[heads] for name, value in self.sums.items()}
            tally.add_sums((self.stack, self.kind, layer), self.heads, self.rows, layer_sums)
        return tally


@dataclass
class CensusSums:
    """What one batch contributed (or, added, a corpus); sums add exactly."""

    tally: Tally = field(default_factory=Tally)
    stacked: dict[tuple[str, str, tuple[int, ...]], StackedSums] = field(
        default_factory=dict)  # (stack, kind, layers) -> sums
    syntax: SyntaxCounts | None = None
    distances: HeadDistances | None = None
    sentences: int = 0

    def __add__(self, other: CensusSums) -> CensusSums:
        def plus(a: Any, b: Any) -> Any:
            return b if a is None else a if b is None else a + b

        stacked = dict(self.stacked)
        for key, value in other.stacked.items():
            stacked[key] = plus(stacked.get(key), value)
        return CensusSums(self.tally + other.tally, stacked, plus(self.syntax, other.syntax),
                          plus(self.distances, other.distances),
                          self.sentences + other.sentences)

    def shape(self) -> tuple[int, int, float]:
        """``(heads, layers, rows)`` summed over: every (stack, kind, layer, head) site, the
        distinct layers, and the most query rows any layer saw (the corpus' tokens)."""
        heads = {(*site, h) for site, hs in self.tally.heads.items() for h in hs}
        heads |= {(s.stack, s.kind, layer, h) for s in self.stacked.values()
                  for layer in s.layers for h in s.heads}
        rows = [*self.tally.counts.values(), *(s.rows for s in self.stacked.values()), 0.0]
        return len(heads), len({h[2] for h in heads}), max(rows)

    def __repr__(self) -> str:
        heads, layers, rows = self.shape()
        return describe("CensusSums", counted(self.sentences, "sentence"), counted(rows, "row"),
                        f"{counted(heads, 'head')} in {counted(layers, 'layer')}",
                        "syntax" if self.syntax is not None else None,
                        "head distances" if self.distances is not None else None)

    def full_tally(self) -> Tally:
        """Streaming and stacked sums together, per (stack, kind, layer)."""
        return sum((s.to_tally() for s in self.stacked.values()), self.tally)
